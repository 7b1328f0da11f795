/*
 * recvmmsg: recvmmsg(2) on an offloaded socket under vmaxdp run.
 *
 *   recvmmsg PORT
 *
 * It binds PORT, prints "ready" and takes the datagrams the test sends:
 *  - three at once, with recvmmsg(8, timeout 300 ms): the first is waited
 *    for, the others are taken, and the call returns 3 once the timeout
 *    has passed (the kernel would wait for an eighth: recvmmsg(2), BUGS),
 *    with the time left (0) written back;
 *  - then it prints "waitforone" and takes the next ones with
 *    MSG_WAITFORONE: the first is waited for, and the call returns at once
 *    with what is queued.
 * Each check prints "ok NAME" or "FAIL NAME: why"; a watchdog ends the
 * program after 20 s.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include "watchdog.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	start_watchdog();
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
	if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		perror("bind");
		return 2;
	}
	enum { N = 8 };
	char bufs[N][64];
	struct iovec iov[N];
	struct mmsghdr v[N];
	memset(v, 0, sizeof v);
	for (int i = 0; i < N; i++) {
		iov[i] = (struct iovec){.iov_base = bufs[i], .iov_len = sizeof bufs[i]};
		v[i].msg_hdr.msg_iov = &iov[i];
		v[i].msg_hdr.msg_iovlen = 1;
	}
	int failed = 0;
	printf("ready\n");
	fflush(stdout);
	struct timespec timeout = {.tv_nsec = 300000000};
	int r = recvmmsg(fd, v, N, 0, &timeout);
	double t1 = now();
	int ok = r == 3 && v[0].msg_len == 4 && !memcmp(bufs[0], "one", 4) && !memcmp(bufs[2], "thr", 4) &&
		 timeout.tv_sec == 0 && timeout.tv_nsec == 0;
	printf("%s timeout: returned %d, time left %ld.%09ld\n", ok ? "ok" : "FAIL", r, (long)timeout.tv_sec, timeout.tv_nsec);
	failed |= !ok;
	printf("waitforone\n");
	fflush(stdout);
	r = recvmmsg(fd, v, N, MSG_WAITFORONE, NULL);
	ok = r >= 1 && r <= 2 && now() - t1 < 10;
	printf("%s waitforone: returned %d\n", ok ? "ok" : "FAIL", r);
	return failed;
}
