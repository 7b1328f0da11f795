/* forkkeep: a server whose event loop serves its socket (poll, then
 * accept or receive) and that forks a child in the middle, as redis forks
 * for BGSAVE, dnsmasq for a TCP query, or a daemon for a helper. The socket is not close-on-exec, so the child
 * could hand it to a program it execs.
 *
 *   forkkeep tcp|udp keep|claim|exec PORT
 *
 * It answers one request (TCP: accepts a connection and echoes what it
 * reads; UDP: echoes a datagram), then forks:
 *   - keep: the child never touches the socket; it sleeps 50 ms and exits.
 *   - claim: the child uses the socket: it polls it (which claims it from
 *     the parent's engine), prints "child ready", answers one request and
 *     exits.
 *   - exec: the child execs this program again (forkkeep serve tcp|udp
 *     FD), which prints "child ready" and answers one request on the
 *     socket it inherited.
 * The parent waits for the child, answers one more request and prints
 * "ok". */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "watchdog.h"

static int tcp;

/* answer waits for one request on s, and serves it. */
static int answer(int s)
{
	char b[256];
	struct pollfd p = {.fd = s, .events = POLLIN};
	if (poll(&p, 1, -1) != 1) {
		perror("poll");
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

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "serve")) {
		tcp = !strcmp(argv[2], "tcp");
		printf("child ready\n");
		fflush(stdout);
		return answer(atoi(argv[3])) < 0;
	}
	if (argc != 4 || (strcmp(argv[1], "tcp") && strcmp(argv[1], "udp")) ||
	    (strcmp(argv[2], "keep") && strcmp(argv[2], "claim") && strcmp(argv[2], "exec"))) {
		fprintf(stderr, "usage: forkkeep tcp|udp keep|claim|exec PORT\n");
		return 2;
	}
	tcp = !strcmp(argv[1], "tcp");
	const char *mode = argv[2];
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
		struct pollfd p = {.fd = s, .events = POLLIN};
		poll(&p, 1, 0);
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
