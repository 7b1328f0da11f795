/* forkuse: a server that answers each connection, then forks a child that
 * goes on with it, as a CGI server does (Python's http.server --cgi): the
 * parent has read the request and written to the connection, so it is in
 * use at the fork. It waits for each connection in poll, as an event loop
 * does.
 *
 *   forkuse PORT CONNECTIONS
 *
 * Each client sends a mode, a line; the parent answers "parent got MODE",
 * forks, waits for the child, then writes "parent after child" and
 * closes. The child, by mode:
 *   cgi     makes the connection its standard output and execs
 *           /bin/sh -c 'echo child cgi';
 *   write   writes "child write";
 *   poll    asks its local address (an IPv4 one), polls it for POLLOUT,
 *           then writes "child poll";
 *   dup     writes "child dup copy" on a copy the parent made before the
 *           fork, then "child dup original" on the connection;
 *   unread  reads what the client sent after the parent's answer (the
 *           parent polled until it came, and left it unread), and
 *           writes "child read LINE";
 *   epoll   writes "child epoll" on a connection the parent has in an
 *           epoll set; if that fails with ENOTCONN (vmaxdp cannot hand
 *           it over: the set's registration is of its mirror), the child
 *           exits 3 and the parent writes "parent for child: ENOTCONN". */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tcplisten.h"
#include "watchdog.h"

static int say(int fd, const char *s) { return write(fd, s, strlen(s)) == (ssize_t)strlen(s) ? 0 : -1; }

/* child serves mode on c (d: the parent's copy, or -1) and exits. */
static void child(const char *mode, int c, int d)
{
	if (strcmp(mode, "cgi") == 0) {
		dup2(c, 1);
		close(c);
		execl("/bin/sh", "sh", "-c", "echo child cgi", (char *)NULL);
		_exit(1);
	}
	if (strcmp(mode, "poll") == 0) {
		struct sockaddr_storage a;
		socklen_t alen = sizeof a;
		if (getsockname(c, (struct sockaddr *)&a, &alen) < 0 || a.ss_family != AF_INET)
			_exit(1);
		struct pollfd p = {.fd = c, .events = POLLOUT};
		if (poll(&p, 1, 5000) != 1 || !(p.revents & POLLOUT))
			_exit(1);
	}
	if (strcmp(mode, "dup") == 0)
		_exit(say(d, "child dup copy\n") || say(c, "child dup original\n"));
	if (strcmp(mode, "unread") == 0) {
		char b[64];
		ssize_t n = read(c, b, sizeof b - 1);
		if (n <= 0)
			_exit(1);
		b[n] = 0;
		char line[96];
		snprintf(line, sizeof line, "child read %s", b);
		_exit(say(c, line) ? 1 : 0);
	}
	char line[64];
	snprintf(line, sizeof line, "child %s\n", mode);
	if (say(c, line) < 0)
		_exit(errno == ENOTCONN ? 3 : 1);
	_exit(0);
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: forkuse PORT CONNECTIONS\n");
		return 2;
	}
	int port = atoi(argv[1]), conns = atoi(argv[2]);
	start_watchdog();
	int l = tcp_listen(port, 16);
	if (l < 0)
		return 1;
	/* Close-on-exec, as the script must not inherit it: under vmaxdp an
	 * inherited listener goes to the kernel. */
	fcntl(l, F_SETFD, FD_CLOEXEC);
	printf("listening\n");
	fflush(stdout);
	for (int i = 0; i < conns; i++) {
		/* An event loop's wait, as a server's: under vmaxdp the listener
		 * stays offloaded across the forks. */
		struct pollfd lp = {.fd = l, .events = POLLIN};
		int c = poll(&lp, 1, 10000) == 1 ? accept(l, NULL, NULL) : -1;
		char mode[32];
		ssize_t n = c < 0 ? -1 : read(c, mode, sizeof mode - 1);
		if (n <= 1 || mode[n - 1] != '\n') {
			printf("FAIL connection %d: no mode\n", i);
			return 1;
		}
		mode[n - 1] = 0;
		char line[64];
		snprintf(line, sizeof line, "parent got %s\n", mode);
		if (say(c, line) < 0) {
			printf("FAIL %s: the parent's answer: %s\n", mode, strerror(errno));
			return 1;
		}
		int d = -1, ep = -1;
		if (strcmp(mode, "dup") == 0)
			d = dup(c);
		if (strcmp(mode, "unread") == 0) {
			struct pollfd p = {.fd = c, .events = POLLIN};
			if (poll(&p, 1, 5000) != 1) {
				printf("FAIL unread: nothing came\n");
				return 1;
			}
		}
		if (strcmp(mode, "epoll") == 0) {
			struct epoll_event ev = {.events = EPOLLIN, .data.fd = c};
			if ((ep = epoll_create1(0)) < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) < 0)
				return 1;
		}
		fflush(stdout);
		pid_t pid = fork();
		if (pid == 0)
			child(mode, c, d);
		int st;
		if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) {
			printf("FAIL %s: the child\n", mode);
			return 1;
		}
		if (WEXITSTATUS(st) == 3)
			say(c, "parent for child: ENOTCONN\n");
		else if (WEXITSTATUS(st) != 0)
			printf("FAIL %s: the child exited %d\n", mode, WEXITSTATUS(st));
		if (say(c, "parent after child\n") < 0)
			printf("FAIL %s: the parent's write after the child: %s\n", mode, strerror(errno));
		printf("served %s\n", mode);
		fflush(stdout);
		if (d >= 0)
			close(d);
		if (ep >= 0)
			close(ep);
		close(c);
	}
	printf("ok\n");
	return 0;
}
