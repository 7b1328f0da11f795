/*
 * exitburst: sends a burst of UDP datagrams and ends the process at once,
 * in one of the ways a program ends, without closing the socket. The
 * kernel sends every datagram whose sendto returned, whatever comes after;
 * under vmaxdp the last ones may still wait on the TX ring for a coalesced
 * kick when the process ends.
 *
 *   exitburst ADDR PORT COUNT HOW
 *
 * HOW: return (from main), exit, _exit, _Exit, exit_group (through
 * syscall(2)), vfork (a vfork child that calls _exit, then the parent's
 * _exit), exec (execl of true(1), which replaces the program), sigterm
 * (raise(SIGTERM) at its default action), sigterm-dfl (SIGTERM set to
 * SIG_DFL by the program, then sent to the process with kill(2)), or
 * handler (a SIGTERM handler that calls _exit(0), then raise(SIGTERM)),
 * sigkill (the program spins after its burst, making no call, until the
 * test kills it with SIGKILL, which no handler sees: only a process
 * outside can send what is left) or abort (abort(3), SIGABRT at its
 * default action, as a failed assertion ends a program).
 * Each datagram holds its index. It prints "sent COUNT" just before it
 * ends; sigkill and abort print "sending COUNT" before the burst instead,
 * and end right after it, so that no write of theirs kicks the TX ring. First it checks that SIGTERM and SIGINT are at SIG_DFL, as its
 * parent gave them, whatever vmaxdp puts there.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include "watchdog.h"

static void on_term(int sig)
{
	(void)sig;
	_exit(0);
}

/* at_default says whether sig is at SIG_DFL, as sigaction reports it. */
static int at_default(int sig)
{
	struct sigaction a;
	return sigaction(sig, NULL, &a) == 0 && !(a.sa_flags & SA_SIGINFO) && a.sa_handler == SIG_DFL;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: exitburst ADDR PORT COUNT HOW\n");
		return 2;
	}
	start_watchdog();
	const char *how = argv[4], *hows[] = {"return", "exit", "_exit", "_Exit", "exit_group", "vfork", "exec",
				       "sigterm", "sigterm-dfl", "handler", "sigkill", "abort"};
	int known = 0;
	for (size_t i = 0; i < sizeof hows / sizeof hows[0]; i++)
		known |= strcmp(how, hows[i]) == 0;
	if (!known) {
		fprintf(stderr, "exitburst: %s: no such way to end\n", how);
		return 2;
	}
	if (!at_default(SIGTERM) || !at_default(SIGINT)) {
		fprintf(stderr, "exitburst: SIGTERM or SIGINT is not at SIG_DFL\n");
		return 2;
	}
	if (strcmp(how, "sigterm-dfl") == 0 && signal(SIGTERM, SIG_DFL) != SIG_DFL) {
		fprintf(stderr, "exitburst: signal(SIGTERM, SIG_DFL) did not return SIG_DFL\n");
		return 2;
	}
	if (strcmp(how, "handler") == 0 && signal(SIGTERM, on_term) != SIG_DFL) {
		fprintf(stderr, "exitburst: signal(SIGTERM, handler) did not return SIG_DFL\n");
		return 2;
	}
	struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[2]))};
	if (inet_pton(AF_INET, argv[1], &to.sin_addr) != 1) {
		fprintf(stderr, "exitburst: %s: not an IPv4 address\n", argv[1]);
		return 2;
	}
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	if (fd < 0) {
		perror("exitburst: socket");
		return 2;
	}
	int count = atoi(argv[3]);
	int at_once = strcmp(how, "sigkill") == 0 || strcmp(how, "abort") == 0;
	if (at_once) {
		printf("sending %d\n", count);
		fflush(stdout);
	}
	for (int i = 0; i < count; i++) {
		char buf[16];
		int n = snprintf(buf, sizeof buf, "%d", i);
		if (sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&to, sizeof to) != n) {
			perror("exitburst: sendto");
			return 2;
		}
	}
	if (strcmp(how, "vfork") == 0) {
		pid_t pid = vfork();
		if (pid == 0)
			_exit(3);
		int status;
		if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 3) {
			fprintf(stderr, "exitburst: the vfork child did not exit with 3\n");
			return 2;
		}
	}
	if (strcmp(how, "sigkill") == 0)
		for (;;)
			__asm__ volatile("" ::: "memory");
	if (strcmp(how, "abort") == 0)
		abort();
	printf("sent %d\n", count);
	fflush(stdout);
	if (strcmp(how, "exit") == 0)
		exit(0);
	if (strcmp(how, "_exit") == 0 || strcmp(how, "vfork") == 0)
		_exit(0);
	if (strcmp(how, "_Exit") == 0)
		_Exit(0);
	if (strcmp(how, "exit_group") == 0)
		syscall(SYS_exit_group, 0);
	if (strcmp(how, "sigterm") == 0 || strcmp(how, "handler") == 0)
		raise(SIGTERM);
	if (strcmp(how, "sigterm-dfl") == 0)
		kill(getpid(), SIGTERM);
	if (strcmp(how, "exec") == 0) {
		execl("/bin/true", "true", (char *)NULL);
		perror("exitburst: execl /bin/true");
		return 2;
	}
	return 0;
}
