/*
 * fortify: the calls a _FORTIFY_SOURCE build makes instead of poll and
 * ppoll (__poll_chk, __ppoll_chk: Debian builds its packages so, and
 * memcached and nsd call them) on an offloaded socket under vmaxdp run.
 *
 *   fortify PORT NFDS
 *
 * NFDS (1) comes from the command line, so that the compiler cannot
 * check the array's size itself and calls the checking variants. It binds
 * PORT, prints "bound", then waits for a datagram with poll and another
 * with ppoll, 10 s each; each check prints "ok NAME" or "FAIL NAME: why";
 * a watchdog ends the program after 20 s.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include "watchdog.h"

static int check(const char *name, int fd, int r, struct pollfd *p)
{
	char b[64];
	if (r != 1 || !(p->revents & POLLIN)) {
		printf("FAIL %s: returned %d, revents %#x\n", name, r, p->revents);
		return 1;
	}
	if (recv(fd, b, sizeof b, MSG_DONTWAIT) <= 0) {
		printf("FAIL %s: readable, but no datagram\n", name);
		return 1;
	}
	printf("ok %s\n", name);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 3)
		return 2;
	start_watchdog();
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
	if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		perror("bind");
		return 2;
	}
	nfds_t n = (nfds_t)atoi(argv[2]);
	struct pollfd p[4] = {{.fd = fd, .events = POLLIN}};
	printf("bound\n");
	fflush(stdout);
	int failed = check("poll", fd, poll(p, n, 10000), p);
	printf("poll done\n");
	fflush(stdout);
	p[0].revents = 0;
	struct timespec ten = {.tv_sec = 10};
	failed |= check("ppoll", fd, ppoll(p, n, &ten, NULL), p);
	return failed;
}
