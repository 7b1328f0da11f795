/*
 * cancel: pthread_cancel of a thread that waits in a call vmaxdp serves.
 * Each check prints "ok NAME" or "FAIL NAME: why"; the program exits 1
 * when one failed.
 *
 *   cancel PORT
 *
 * It binds an offloaded UDP socket to PORT (fd 3) and waits for "go" (the
 * test sends it once the socket is offloaded). Then, for each of
 * recvfrom, recvmsg, poll, select and epoll_wait, a thread blocks in the
 * call on that socket and is cancelled: pthread_join must return
 * PTHREAD_CANCELED within 2 s. These calls are cancellation points
 * (pthreads(7)); udp-sender cancels its return channel's thread, blocked
 * in recvfrom, at the end of every transfer, and hung for ever in
 * pthread_join. Then:
 *  - disabled: a thread with cancellation disabled is cancelled while it
 *    waits in recvfrom: the call goes on waiting (no EINTR), returns the
 *    datagram that comes later (the program prints "disabled waiting"
 *    and waits for one on PORT), and the thread is cancelled once it
 *    enables cancellation again;
 *  - pending: a cancel that came before the call acts as it starts.
 * A watchdog ends the program after 20 s.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include "cancelcheck.h"
#include "watchdog.h"

static int fd;
static volatile int got; /* the disabled check's datagram length */

static void *in_recvfrom(void *arg)
{
	char b[64];
	(void)arg;
	for (;;)
		recvfrom(fd, b, sizeof b, 0, NULL, NULL);
	return NULL;
}

static void *in_recvmsg(void *arg)
{
	char b[64];
	struct iovec v = {.iov_base = b, .iov_len = sizeof b};
	struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1};
	(void)arg;
	for (;;)
		recvmsg(fd, &m, 0);
	return NULL;
}

static void *in_poll(void *arg)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	(void)arg;
	for (;;)
		poll(&p, 1, -1);
	return NULL;
}

static void *in_select(void *arg)
{
	(void)arg;
	for (;;) {
		fd_set r;
		FD_ZERO(&r);
		FD_SET(fd, &r);
		select(fd + 1, &r, NULL, NULL, NULL);
	}
	return NULL;
}

static void *in_epoll(void *arg)
{
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd}, out;
	int ep = epoll_create1(0);
	(void)arg;
	epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
	for (;;)
		epoll_wait(ep, &out, 1, -1);
	return NULL;
}

static void *disabled(void *arg)
{
	char b[64];
	(void)arg;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
	ssize_t n = recvfrom(fd, b, sizeof b, 0, NULL, NULL);
	got = n < 0 ? -errno : (int)n;
	pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
	pthread_testcancel();
	return NULL;
}

static void *pending(void *arg)
{
	char b[64];
	(void)arg;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
	while (!*(volatile int *)arg)
		usleep(1000);
	pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
	recvfrom(fd, b, sizeof b, 0, NULL, NULL);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: cancel PORT\n");
		return 2;
	}
	start_watchdog();
	fd = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
	if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
		perror("bind");
		return 2;
	}
	printf("bound\n");
	fflush(stdout);
	char b[64];
	if (recvfrom(fd, b, sizeof b, 0, NULL, NULL) < 0) {
		perror("recvfrom go");
		return 2;
	}

	static const struct {
		const char *name;
		void *(*run)(void *);
	} calls[] = {{"recvfrom", in_recvfrom}, {"recvmsg", in_recvmsg}, {"poll", in_poll}, {"select", in_select}, {"epoll_wait", in_epoll}};
	for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
		pthread_t t;
		pthread_create(&t, NULL, calls[i].run, NULL);
		check(calls[i].name, cancelled(t), "the thread was not cancelled within 2 s");
	}

	pthread_t t;
	pthread_create(&t, NULL, disabled, NULL);
	usleep(100000);
	pthread_cancel(t);
	usleep(100000);
	printf("disabled waiting\n");
	fflush(stdout);
	void *res = NULL;
	pthread_join(t, &res);
	check("disabled", got == 4 && res == PTHREAD_CANCELED,
	      got < 0 ? "the wait ended with an error" : "no datagram, or not cancelled after it");

	volatile int go = 0;
	pthread_create(&t, NULL, pending, (void *)&go);
	pthread_cancel(t);
	go = 1;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 2;
	check("pending", pthread_timedjoin_np(t, &res, &ts) == 0 && res == PTHREAD_CANCELED,
	      "a cancel pending at recvfrom did not act");
	return failed;
}
