/*
 * tcpcancel: pthread_cancel of a thread that waits in a TCP call vmaxdp
 * serves (VMAXDP_TCP=1). Each check prints "ok NAME" or "FAIL NAME: why";
 * the program exits 1 when one failed.
 *
 *   tcpcancel PORT PEER FULLPORT
 *
 * It listens on PORT (fd 3), prints "listening" and accepts one
 * connection, which the test makes and then leaves alone. Then a thread
 * blocks in a call and is cancelled; pthread_join must return
 * PTHREAD_CANCELED within 2 s. The calls: accept on the listener; read,
 * recv and recvmsg on the connection; write on it once its buffers are
 * full; connect to PEER:FULLPORT, the test's listener with a backlog of 0
 * and a connection of this program's in its accept queue, which drops
 * every SYN after. These are cancellation points (pthreads(7)): a server
 * that cancels its connection threads at shutdown waits for them.
 * Then, connect disabled: a thread with cancellation disabled is
 * cancelled while its connect waits; the connect goes on (no EINTR, no
 * EALREADY: the program prints "connect disabled waiting", and the test
 * accepts from then on) and returns 0, and the thread is cancelled once
 * it enables cancellation again. A watchdog ends the program after 20 s.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include "tcplisten.h"
#include "cancelcheck.h"
#include "watchdog.h"

static int lfd, conn;
static struct sockaddr_in full;
static volatile int connected; /* the disabled check's connect: 0, or -errno */

static void *in_accept(void *arg)
{
	(void)arg;
	for (;;)
		accept(lfd, NULL, NULL);
	return NULL;
}

static void *in_read(void *arg)
{
	char b[64];
	(void)arg;
	for (;;)
		if (read(conn, b, sizeof b) == 0)
			pause(); /* the test's client never closes first */
	return NULL;
}

static void *in_recv(void *arg)
{
	char b[64];
	(void)arg;
	for (;;)
		recv(conn, b, sizeof b, 0);
	return NULL;
}

static void *in_recvmsg(void *arg)
{
	char b[64];
	struct iovec v = {.iov_base = b, .iov_len = sizeof b};
	struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1};
	(void)arg;
	for (;;)
		recvmsg(conn, &m, 0);
	return NULL;
}

static char junk[65536];

static void *in_write(void *arg)
{
	(void)arg;
	for (;;)
		if (write(conn, junk, sizeof junk) < 0)
			pause(); /* the test's client never closes first */
	return NULL;
}

static int fd_connect; /* in_connect's socket, closed once it is cancelled */

static void *in_connect(void *arg)
{
	(void)arg;
	connect(fd_connect, (struct sockaddr *)&full, sizeof full);
	return NULL;
}

static void *disabled(void *arg)
{
	int s = *(int *)arg;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
	connected = connect(s, (struct sockaddr *)&full, sizeof full) == 0 ? 0 : -errno;
	pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
	pthread_testcancel();
	return NULL;
}

/* fill writes to conn until its buffers are full. */
static int fill(void)
{
	int fl = fcntl(conn, F_GETFL);
	fcntl(conn, F_SETFL, fl | O_NONBLOCK);
	int full_ = 0;
	for (int i = 0; i < 4096 && !full_; i++)
		full_ = write(conn, junk, sizeof junk) < 0 && errno == EAGAIN;
	fcntl(conn, F_SETFL, fl);
	return full_;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: tcpcancel PORT PEER FULLPORT\n");
		return 2;
	}
	start_watchdog();
	if ((lfd = tcp_listen(atoi(argv[1]), 16)) < 0)
		return 2;
	full.sin_family = AF_INET;
	full.sin_port = htons(atoi(argv[3]));
	if (inet_pton(AF_INET, argv[2], &full.sin_addr) != 1) {
		fprintf(stderr, "tcpcancel: %s: not an IPv4 address\n", argv[2]);
		return 2;
	}
	printf("listening\n");
	fflush(stdout);
	if ((conn = accept(lfd, NULL, NULL)) < 0) {
		perror("accept");
		return 2;
	}
	/* The connection that fills the peer's accept queue. */
	int filler = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(filler, (struct sockaddr *)&full, sizeof full) != 0) {
		perror("connect to the full listener");
		return 2;
	}

	static const struct {
		const char *name;
		void *(*run)(void *);
	} calls[] = {{"accept", in_accept}, {"read", in_read}, {"recv", in_recv}, {"recvmsg", in_recvmsg}};
	for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
		pthread_t t;
		pthread_create(&t, NULL, calls[i].run, NULL);
		check(calls[i].name, cancelled(t), "the thread was not cancelled within 2 s");
	}

	pthread_t t;
	if (!fill())
		check("write", 0, "the connection's buffers never filled");
	else {
		pthread_create(&t, NULL, in_write, NULL);
		check("write", cancelled(t), "the thread was not cancelled within 2 s");
	}

	fd_connect = socket(AF_INET, SOCK_STREAM, 0);
	pthread_create(&t, NULL, in_connect, NULL);
	check("connect", cancelled(t), "the thread was not cancelled within 2 s");
	close(fd_connect); /* its SYNs would take the slot the next check waits for */

	int s = socket(AF_INET, SOCK_STREAM, 0);
	pthread_create(&t, NULL, disabled, &s);
	usleep(100000);
	pthread_cancel(t);
	usleep(100000);
	printf("connect disabled waiting\n");
	fflush(stdout);
	void *res = NULL;
	pthread_join(t, &res);
	check("connect-disabled", connected == 0 && res == PTHREAD_CANCELED,
	      connected < 0 ? strerror(-connected) : "not cancelled after the connect");
	return failed;
}
