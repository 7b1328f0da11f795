/* forkserve: a server that accepts each connection and forks a child to
 * serve it, as inetd, sshd, socat's fork and Python's ForkingTCPServer
 * do: the child reads a request and echoes it, then exits; the parent
 * closes its copy of the connection and accepts the next.
 *
 *   forkserve PORT REQUESTS [PAUSE_MS]
 *
 * With PAUSE_MS, the server waits that long between its first accept and
 * its first fork: a client that connects meanwhile is one the listener
 * holds, not yet accepted, as the server forks.
 *
 * Under vmaxdp the first connection is offloaded (the listener is, until
 * the first fork hands it back to the kernel), and it must move to the
 * kernel before the fork for the child to serve it. */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tcplisten.h"
#include "watchdog.h"

int main(int argc, char **argv)
{
	if (argc != 3 && argc != 4) {
		fprintf(stderr, "usage: forkserve PORT REQUESTS [PAUSE_MS]\n");
		return 2;
	}
	int port = atoi(argv[1]), requests = atoi(argv[2]), pause_ms = argc == 4 ? atoi(argv[3]) : 0;
	start_watchdog();
	int l = tcp_listen(port, 64);
	if (l < 0)
		return 1;
	printf("listening\n");
	fflush(stdout);
	int served = 0;
	for (int i = 0; i < requests; i++) {
		int c = accept(l, NULL, NULL);
		if (c < 0) {
			perror("accept");
			return 1;
		}
		if (i == 0 && pause_ms > 0) {
			printf("accepted, pausing\n");
			fflush(stdout);
			usleep((useconds_t)pause_ms * 1000);
		}
		pid_t pid = fork();
		if (pid < 0) {
			perror("fork");
			return 1;
		}
		if (pid == 0) {
			close(l);
			char b[256];
			ssize_t n = read(c, b, sizeof b);
			if (n <= 0 || write(c, b, (size_t)n) != n) {
				perror("child");
				_exit(1);
			}
			close(c);
			_exit(0);
		}
		close(c);
		int st;
		if (waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0)
			served++;
	}
	printf("ok served %d of %d\n", served, requests);
	fflush(stdout);
	return 0;
}
