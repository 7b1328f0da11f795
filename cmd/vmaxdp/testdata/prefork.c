/* prefork: a master that listens, accepts a first connection itself, and
 * then forks WORKERS workers that accept and echo, as prefork servers do.
 *
 *   prefork PORT WORKERS REQUESTS [epoll]
 *
 * With epoll, each worker waits for the listener in epoll_wait and then
 * accepts without blocking until EAGAIN, as nginx's workers do; else it
 * blocks in accept.
 * After its first read the master waits for one more byte on its
 * connection before it forks: a client connects meanwhile, and its
 * connection must reach a worker as the kernel's backlog would give it.
 * Each worker closes the master's connection it inherited, as prefork
 * servers do, then serves connections, one line each, until the workers
 * together served REQUESTS. The master answers on its own connection
 * after the fork ("master ok"), and waits for its workers. */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tcplisten.h"
#include "watchdog.h"

int main(int argc, char **argv)
{
	if (argc != 4 && !(argc == 5 && strcmp(argv[4], "epoll") == 0)) {
		fprintf(stderr, "usage: prefork PORT WORKERS REQUESTS [epoll]\n");
		return 2;
	}
	int port = atoi(argv[1]), workers = atoi(argv[2]), requests = atoi(argv[3]);
	int use_epoll = argc == 5;
	start_watchdog();
	int *served = mmap(NULL, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	int l = tcp_listen(port, 64);
	if (l < 0)
		return 1;
	printf("listening\n");
	fflush(stdout);
	int first = accept(l, NULL, NULL);
	char b[256];
	ssize_t n = read(first, b, sizeof b);
	printf("master read %zd\n", n);
	fflush(stdout);
	char go;
	if (read(first, &go, 1) != 1) {
		printf("FAIL master: no go\n");
		return 1;
	}
	pid_t pids[64];
	if (workers > 64)
		workers = 64;
	for (int i = 0; i < workers; i++) {
		if ((pids[i] = fork()) != 0)
			continue;
		close(first);
		int ep = -1;
		struct epoll_event ev = {.events = EPOLLIN, .data.fd = l};
		if (use_epoll && ((ep = epoll_create1(0)) < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev) < 0))
			_exit(1);
		for (;;) {
			if (use_epoll && epoll_wait(ep, &ev, 1, -1) < 0 && errno != EINTR)
				_exit(1);
			int c = use_epoll ? accept4(l, NULL, NULL, SOCK_NONBLOCK) : accept(l, NULL, NULL);
			if (c < 0 && use_epoll && (errno == EAGAIN || errno == ECONNABORTED))
				continue;
			if (c < 0)
				_exit(1);
			if (use_epoll) { /* the request is there: the client sends first */
				struct pollfd pfd = {.fd = c, .events = POLLIN};
				poll(&pfd, 1, 5000);
			}
			n = read(c, b, sizeof b);
			if (n > 0 && write(c, b, (size_t)n) != n)
				_exit(1);
			close(c);
			if (__atomic_add_fetch(served, 1, __ATOMIC_SEQ_CST) >= requests)
				break;
		}
		_exit(0);
	}
	if (write(first, "master ok\n", 10) != 10)
		printf("FAIL master write\n");
	close(first);
	int st, ok = 0;
	/* A worker blocked in accept once the others served the rest is
	 * ended by the master. */
	while (__atomic_load_n(served, __ATOMIC_SEQ_CST) < requests)
		usleep(10000);
	usleep(100000);
	for (int i = 0; i < workers; i++)
		kill(pids[i], SIGTERM);
	while (wait(&st) > 0)
		ok++;
	printf("ok served %d by %d workers\n", *served, ok);
	fflush(stdout);
	return 0;
}
