/*
 * txstamps: software transmit timestamps without the packet, as a
 * trading or measuring application asks for them (SO_TIMESTAMPING with
 * SOF_TIMESTAMPING_TX_SOFTWARE, SOFTWARE, OPT_TSONLY and OPT_ID), read
 * from the error queue after poll, epoll and select report it
 * (POLLERR), and turned off again. It prints what it sees in lines that
 * hold no time or address, so that the kernel's run and vmaxdp's compare
 * line by line; a stamp's age is checked, not printed.
 *
 *   txstamps ADDR PORT
 *
 * It connects a UDP socket to ADDR:PORT and sends 7 datagrams in all.
 * "done" ends the output; a watchdog ends the program after 20 s.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <time.h> /* before linux/errqueue.h, which uses struct timespec */
#include <linux/errqueue.h>
#include <linux/net_tstamp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "watchdog.h"

static int fd;

static const char *errname(int e)
{
	return e == EAGAIN ? "EAGAIN" : strerror(e);
}

/* stamp reads one message of the error queue and prints it. */
static void stamp(const char *what)
{
	char ctl[256], name[64];
	struct msghdr m = {.msg_name = name, .msg_namelen = sizeof name, .msg_control = ctl, .msg_controllen = sizeof ctl};
	ssize_t r = recvmsg(fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT);
	if (r < 0) {
		printf("%s: errno %s\n", what, errname(errno));
		return;
	}
	printf("%s: ret %zd flags%s%s namelen %u\n", what, r, m.msg_flags & MSG_ERRQUEUE ? " MSG_ERRQUEUE" : "",
		m.msg_flags & MSG_CTRUNC ? " MSG_CTRUNC" : "", m.msg_namelen);
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPING) {
			struct timespec *ts = (struct timespec *)CMSG_DATA(c), now;
			clock_gettime(CLOCK_REALTIME, &now);
			double age = (now.tv_sec - ts[0].tv_sec) + (now.tv_nsec - ts[0].tv_nsec) / 1e9;
			printf("  SCM_TIMESTAMPING len %zu: software stamp %s, others %s\n", (size_t)c->cmsg_len,
				age >= 0 && age < 5 ? "of the last seconds" : "WRONG",
				ts[1].tv_sec || ts[1].tv_nsec || ts[2].tv_sec || ts[2].tv_nsec ? "set" : "zero");
		} else if (c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR) {
			struct sock_extended_err *ee = (struct sock_extended_err *)CMSG_DATA(c);
			struct sockaddr_in *off = (struct sockaddr_in *)SO_EE_OFFENDER(ee);
			printf("  IP_RECVERR len %zu: errno %s origin %u type %u code %u info %u data %u offender family %u\n",
				(size_t)c->cmsg_len, ee->ee_errno == ENOMSG ? "ENOMSG" : strerror(ee->ee_errno), ee->ee_origin,
				ee->ee_type, ee->ee_code, ee->ee_info, ee->ee_data, off->sin_family);
		} else {
			printf("  level %d type %d len %zu\n", c->cmsg_level, c->cmsg_type, (size_t)c->cmsg_len);
		}
	}
}

static void sendone(void)
{
	if (send(fd, "stamp me", 8, 0) != 8)
		printf("send: errno %s\n", errname(errno));
}

static void setflags(int flags)
{
	if (setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPING, &flags, sizeof flags) != 0)
		printf("SO_TIMESTAMPING %#x: errno %s\n", flags, errname(errno));
}

int main(int argc, char **argv)
{
	if (argc != 3)
		return 2;
	start_watchdog();
	fd = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
	inet_pton(AF_INET, argv[1], &to.sin_addr);
	setflags(SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_TSONLY | SOF_TIMESTAMPING_OPT_ID);
	if (connect(fd, (struct sockaddr *)&to, sizeof to) != 0) {
		perror("connect");
		return 2;
	}
	stamp("before any send");
	for (int i = 0; i < 3; i++)
		sendone();
	struct pollfd p = {.fd = fd, .events = POLLIN};
	int n = poll(&p, 1, 2000);
	printf("poll: %d, revents%s%s\n", n, p.revents & POLLERR ? " POLLERR" : "", p.revents & POLLIN ? " POLLIN" : "");
	for (int i = 0; i < 3; i++)
		stamp("after three sends");
	stamp("then");
	p.revents = 0;
	printf("poll once read: %d\n", poll(&p, 1, 0));

	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN, .data.u32 = 7}, out;
	epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
	sendone();
	n = epoll_wait(ep, &out, 1, 2000);
	printf("epoll_wait: %d, events%s%s data %u\n", n, n == 1 && out.events & EPOLLERR ? " EPOLLERR" : "",
		n == 1 && out.events & EPOLLIN ? " EPOLLIN" : "", n == 1 ? out.data.u32 : 0);
	stamp("after epoll_wait");

	sendone();
	fd_set r;
	FD_ZERO(&r);
	FD_SET(fd, &r);
	struct timeval tv = {2, 0};
	n = select(fd + 1, &r, NULL, NULL, &tv);
	printf("select: %d, readable %d\n", n, n == 1 && FD_ISSET(fd, &r));
	stamp("after select");

	setflags(SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_RX_SOFTWARE);
	sendone();
	sendone();
	p.revents = 0;
	n = poll(&p, 1, 100);
	printf("turned off, two sends: poll %d\n", n);
	stamp("turned off");
	printf("done\n");
	return 0;
}
