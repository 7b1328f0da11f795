/*
 * crossing: what a socket call costs the application under vmaxdp, by the
 * path it takes. Each line is the median of 5 rounds of a non-blocking
 * recvfrom that finds nothing:
 *
 *   loopback NS   a socket bound to 127.0.0.1, which stays on the kernel:
 *                 under vmaxdp the interposer looks its fd up in C and
 *                 calls libc, without entering Go
 *   threaded NS   the same once the process has a second thread, as it
 *                 always has under vmaxdp (glibc's socket calls cost more
 *                 in a multi-threaded process: they are cancellation points)
 *   offloaded NS  a socket bound to ADDR:PORT: under vmaxdp it crosses
 *                 into Go and the engine looks at its queue
 *
 *   crossing ADDR PORT
 *
 * Run it plainly for the kernel's figures, then under vmaxdp run.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <time.h>

enum { CALLS = 200000, ROUNDS = 5 };

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static int bound(const char *addr, int port)
{
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
	inet_pton(AF_INET, addr, &sa.sin_addr);
	if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		perror(addr);
		exit(2);
	}
	return fd;
}

static double measure(int fd)
{
	char buf[64];
	double r[ROUNDS];
	for (int k = 0; k < ROUNDS; k++) {
		double t0 = now();
		for (int i = 0; i < CALLS; i++)
			if (recvfrom(fd, buf, sizeof buf, MSG_DONTWAIT, NULL, NULL) >= 0) {
				fprintf(stderr, "crossing: a datagram came: the measure needs an idle socket\n");
				exit(2);
			}
		r[k] = (now() - t0) / CALLS;
	}
	qsort(r, ROUNDS, sizeof r[0], cmp);
	return r[ROUNDS / 2];
}

static void *idle(void *arg)
{
	for (;;)
		pause();
	return arg;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: crossing ADDR PORT\n");
		return 2;
	}
	int port = atoi(argv[2]);
	int lo = bound("127.0.0.1", port), off = bound(argv[1], port);
	printf("loopback %.1f\n", measure(lo));
	pthread_t t;
	pthread_create(&t, NULL, idle, NULL);
	printf("threaded %.1f\n", measure(lo));
	printf("offloaded %.1f\n", measure(off));
	return 0;
}
