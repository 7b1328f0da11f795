/*
 * fds: the application's fd space under vmaxdp run, as a daemon uses it.
 *
 *   fds PORT NOFILE
 *
 * Run with a soft RLIMIT_NOFILE of NOFILE. It checks:
 *  - rlimit: the soft limit is NOFILE (Go's runtime raises it as it starts;
 *    vmaxdp puts it back);
 *  - closeall: closing every fd from 3 to the limit, as daemons do, closes
 *    none of vmaxdp's (the process would die: "netpoll failed");
 *  - lowfd: after an offloaded bind (the program waits for "go", which the
 *    test sends once the socket is offloaded), the next socket is fd 4 (the
 *    engine's fds are out of the way);
 *  - dup2: dup2 onto one of vmaxdp's fds (a BPF map) fails with EBADF;
 *  - closefrom: closefrom(5) and close_range(5, ~0U) close none of them,
 *    and close the application's own fds there;
 *  - recv: then a datagram still arrives through the engine.
 * Each check prints "ok NAME" or "FAIL NAME: why"; a watchdog ends the
 * program after 20 s.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include "watchdog.h"

static int check(int ok, const char *name, const char *why)
{
	if (ok)
		printf("ok %s\n", name);
	else
		printf("FAIL %s: %s\n", name, why);
	fflush(stdout);
	return ok;
}

/* bpf_map_fd finds an fd that names a BPF map: one of vmaxdp's. */
static int bpf_map_fd(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int found = -1;
	while (d && (e = readdir(d))) {
		char path[300], target[64];
		snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
		ssize_t n = readlink(path, target, sizeof target - 1);
		if (n > 0) {
			target[n] = 0;
			if (strcmp(target, "anon_inode:bpf-map") == 0) {
				found = atoi(e->d_name);
				break;
			}
		}
	}
	if (d)
		closedir(d);
	return found;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: fds PORT NOFILE\n");
		return 2;
	}
	start_watchdog();
	char why[128];

	struct rlimit lim;
	getrlimit(RLIMIT_NOFILE, &lim);
	snprintf(why, sizeof why, "soft limit %ld", (long)lim.rlim_cur);
	check((long)lim.rlim_cur == atol(argv[2]), "rlimit", why);
	for (int fd = 3; fd < (int)lim.rlim_cur; fd++)
		close(fd);
	printf("ok closeall-early\n");

	int s = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
	if (bind(s, (struct sockaddr *)&a, sizeof a) != 0) {
		perror("bind");
		return 1;
	}
	/* The engine opens its stack after bind returns: the test waits for
	 * that, then sends "go". */
	printf("bound\n");
	fflush(stdout);
	char go[8];
	if (recv(s, go, sizeof go, 0) != 2) {
		perror("recv go");
		return 1;
	}
	int next = socket(AF_INET, SOCK_DGRAM, 0);
	snprintf(why, sizeof why, "socket %d, next %d", s, next);
	check(s == 3 && next == 4, "lowfd", why);

	int closed = 0;
	for (int fd = 5; fd < (int)lim.rlim_cur; fd++)
		if (close(fd) == 0)
			closed++;
	snprintf(why, sizeof why, "%d fds closed", closed);
	check(closed == 0, "closeall", why);

	int m = bpf_map_fd();
	int r = m >= 0 ? dup2(next, m) : 0;
	snprintf(why, sizeof why, "map fd %d, dup2 %d, errno %d", m, r, errno);
	check(m > 4 && r == -1 && errno == EBADF, "dup2", why);

	int mine = fcntl(next, F_DUPFD, 5), mine2 = fcntl(next, F_DUPFD, 5);
	closefrom(5);
	int gone = fcntl(mine, F_GETFD) == -1 && errno == EBADF;
	int mine3 = fcntl(next, F_DUPFD, 5);
	int r2 = close_range(5, ~0U, 0);
	int gone3 = fcntl(mine3, F_GETFD) == -1 && errno == EBADF;
	snprintf(why, sizeof why, "own fds %d %d %d closed: %d %d, close_range %d, map fd %d still %s", mine, mine2, mine3,
		 gone, gone3, r2, m, fcntl(m, F_GETFD) >= 0 ? "open" : "closed");
	check(gone && gone3 && r2 == 0 && fcntl(m, F_GETFD) >= 0, "closefrom", why);

	printf("ready\n");
	fflush(stdout);
	char buf[64];
	ssize_t n = recv(s, buf, sizeof buf - 1, 0);
	snprintf(why, sizeof why, "recv %zd (%s)", n, n < 0 ? strerror(errno) : "");
	check(n == 5 && memcmp(buf, "hello", 5) == 0, "recv", why);
	return 0;
}
