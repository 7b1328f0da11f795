/*
 * uringrecv: a UDP server that receives through io_uring (liburing), as
 * newer servers do: it binds its socket, then makes a ring, prints
 * "ready", and receives COUNT datagrams with IORING_OP_RECV, each within
 * 5 s. It prints "got COUNT" at the end, or what it got when one does not
 * come. vmaxdp cannot see the ring's calls: the socket must be the
 * kernel's by the time the datagrams come. With wait, it prints "bound"
 * after its bind and makes its ring only once FILE exists: datagrams sent
 * meanwhile wait in vmaxdp's stack, and must reach the ring all the same.
 * With tcp, it makes its ring first, then connects to ADDR:PORT, and
 * receives COUNT bytes through the ring.
 *
 *   uringrecv ADDR PORT COUNT [tcp | wait FILE]
 */
#include <arpa/inet.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "watchdog.h"

int main(int argc, char **argv)
{
	int tcp = argc == 5 && strcmp(argv[4], "tcp") == 0;
	const char *wait = argc == 6 && strcmp(argv[4], "wait") == 0 ? argv[5] : NULL;
	if (argc != 4 && !tcp && !wait) {
		fprintf(stderr, "usage: uringrecv ADDR PORT COUNT [tcp | wait FILE]\n");
		return 2;
	}
	start_watchdog();
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[2]))};
	if (inet_pton(AF_INET, argv[1], &a.sin_addr) != 1) {
		fprintf(stderr, "uringrecv: %s: not an IPv4 address\n", argv[1]);
		return 2;
	}
	struct io_uring ring;
	int r = 0, fd = socket(AF_INET, tcp ? SOCK_STREAM : SOCK_DGRAM, 0);
	if (tcp)
		r = io_uring_queue_init(8, &ring, 0);
	if (fd < 0 || r < 0 || (tcp ? connect(fd, (struct sockaddr *)&a, sizeof a) : bind(fd, (struct sockaddr *)&a, sizeof a)) != 0) {
		perror("uringrecv: socket, ring, connect or bind");
		return 2;
	}
	if (wait) {
		printf("bound\n");
		fflush(stdout);
		struct stat st;
		struct timespec tick = {.tv_nsec = 10 * 1000 * 1000};
		while (stat(wait, &st) != 0) /* the watchdog bounds the wait */
			nanosleep(&tick, NULL);
	}
	if (!tcp && (r = io_uring_queue_init(8, &ring, 0)) < 0) {
		fprintf(stderr, "uringrecv: io_uring_queue_init: %s\n", strerror(-r));
		return 2;
	}
	printf("ready\n");
	fflush(stdout);
	int count = atoi(argv[3]), got = 0;
	char buf[2048];
	while (got < count) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
		io_uring_prep_recv(sqe, fd, buf, sizeof buf, 0);
		io_uring_submit(&ring);
		struct __kernel_timespec ts = {.tv_sec = 5};
		struct io_uring_cqe *cqe;
		if ((r = io_uring_wait_cqe_timeout(&ring, &cqe, &ts)) < 0) {
			printf("got %d, then none for 5 s: %s\n", got, strerror(-r));
			return 1;
		}
		if (cqe->res <= 0) {
			printf("got %d, then recv: %s\n", got, cqe->res < 0 ? strerror(-cqe->res) : "end of stream");
			return 1;
		}
		got += tcp ? cqe->res : 1; /* bytes, or datagrams */
		io_uring_cqe_seen(&ring, cqe);
	}
	printf("got %d\n", got);
	return 0;
}
