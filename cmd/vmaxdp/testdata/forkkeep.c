/* forkkeep: a server whose event loop serves its socket (poll, then
 * accept or receive) and that forks a child in the middle, as redis forks
 * for BGSAVE, dnsmasq for a TCP query, or a daemon for a helper. The socket is not close-on-exec, so the child
 * could hand it to a program it execs.
 *
 *   forkkeep tcp|udp keep|claim|select|exec|pass PORT
 *
 * It answers one request (TCP: accepts a connection and echoes what it
 * reads; UDP: echoes a datagram), then forks:
 *   - keep: the child never touches the socket; it sleeps 50 ms and exits.
 *   - claim: the child uses the socket: it polls it (which claims it from
 *     the parent's engine), prints "child ready", answers one request and
 *     exits.
 *   - select: as claim, with select in place of poll, in both processes.
 *   - exec: the child execs this program again (forkkeep serve tcp|udp
 *     FD), which prints "child ready" and answers one request on the
 *     socket it inherited.
 *   - pass: the child passes the socket through a Unix socket pair
 *     (SCM_RIGHTS, as a process hands a socket to another), then prints
 *     "child ready" and answers one request on the fd it received.
 * The parent waits for the child, answers one more request and prints
 * "ok". */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "watchdog.h"

static int tcp, use_select;

/* readable waits for s to be readable (timeout -1: for ever; 0: a look), with
 * poll or select. */
static int readable(int s, int timeout)
{
	if (use_select) {
		fd_set r;
		FD_ZERO(&r);
		FD_SET(s, &r);
		struct timeval zero = {0};
		return select(s + 1, &r, NULL, NULL, timeout < 0 ? NULL : &zero);
	}
	struct pollfd p = {.fd = s, .events = POLLIN};
	return poll(&p, 1, timeout);
}

/* answer waits for one request on s, and serves it. */
static int answer(int s)
{
	char b[256];
	if (readable(s, -1) != 1) {
		perror("readable");
		return -1;
	}
	if (tcp) {
		int c = accept(s, NULL, NULL);
		if (c < 0) {
			perror("accept");
			return -1;
		}
		ssize_t n = read(c, b, sizeof b);
		if (n <= 0 || write(c, b, (size_t)n) != n) {
			perror("echo");
			return -1;
		}
		close(c);
		return 0;
	}
	struct sockaddr_in from;
	socklen_t alen = sizeof from;
	ssize_t n = recvfrom(s, b, sizeof b, 0, (struct sockaddr *)&from, &alen);
	if (n < 0 || sendto(s, b, (size_t)n, 0, (struct sockaddr *)&from, alen) != n) {
		perror("echo");
		return -1;
	}
	return 0;
}

/* pass sends s over a Unix socket pair and serves one request on the fd
 * that comes out of it. */
static int pass(int s)
{
	int sp[2];
	if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sp) < 0) {
		perror("socketpair");
		return -1;
	}
	char byte = 0, ctl[CMSG_SPACE(sizeof(int))] = {0};
	struct iovec iov = {.iov_base = &byte, .iov_len = 1};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &s, sizeof s);
	if (sendmsg(sp[0], &m, 0) != 1 || recvmsg(sp[1], &m, 0) != 1 || !(c = CMSG_FIRSTHDR(&m))) {
		perror("pass");
		return -1;
	}
	int got;
	memcpy(&got, CMSG_DATA(c), sizeof got);
	close(s);
	printf("child ready\n");
	fflush(stdout);
	return answer(got);
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "serve")) {
		tcp = !strcmp(argv[2], "tcp");
		printf("child ready\n");
		fflush(stdout);
		return answer(atoi(argv[3])) < 0;
	}
	if (argc != 4 || (strcmp(argv[1], "tcp") && strcmp(argv[1], "udp")) ||
	    (strcmp(argv[2], "keep") && strcmp(argv[2], "claim") && strcmp(argv[2], "select") && strcmp(argv[2], "exec") &&
	     strcmp(argv[2], "pass"))) {
		fprintf(stderr, "usage: forkkeep tcp|udp keep|claim|select|exec|pass PORT\n");
		return 2;
	}
	tcp = !strcmp(argv[1], "tcp");
	const char *mode = argv[2];
	use_select = !strcmp(mode, "select");
	start_watchdog();
	int s = socket(AF_INET, tcp ? SOCK_STREAM : SOCK_DGRAM, 0), one = 1;
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[3]))};
	if (bind(s, (struct sockaddr *)&a, sizeof a) < 0 || (tcp && listen(s, 64) < 0)) {
		perror("bind");
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	if (answer(s) < 0)
		return 1;
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		return 1;
	}
	if (pid == 0) {
		if (!strcmp(mode, "keep")) {
			usleep(50 * 1000);
			_exit(0);
		}
		if (!strcmp(mode, "exec")) {
			char fd[16];
			snprintf(fd, sizeof fd, "%d", s);
			execl("/proc/self/exe", argv[0], "serve", argv[1], fd, (char *)NULL);
			perror("exec");
			_exit(1);
		}
		if (!strcmp(mode, "pass")) {
			_exit(pass(s) < 0);
		}
		readable(s, 0);
		printf("child ready\n");
		fflush(stdout);
		_exit(answer(s) < 0);
	}
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		printf("FAIL child: status %d\n", st);
		return 1;
	}
	if (answer(s) < 0)
		return 1;
	printf("ok\n");
	fflush(stdout);
	return 0;
}
