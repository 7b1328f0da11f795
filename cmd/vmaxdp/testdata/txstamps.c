/*
 * txstamps: software transmit timestamps without the packet, as a
 * trading or measuring application asks for them (SO_TIMESTAMPING with
 * SOF_TIMESTAMPING_TX_SOFTWARE, SOFTWARE, OPT_TSONLY and OPT_ID), read
 * from the error queue after poll, epoll and select report it
 * (POLLERR), and turned off again; then with the packet looped back, as
 * chrony asks for them (no OPT_TSONLY; OPT_CMSG with IP_PKTINFO, and
 * SO_SELECT_ERR_QUEUE for select's exceptfds), read whole and into a
 * short buffer; last, a stamp asked for by one send's ancillary data (as
 * chrony's server asks in interleaved mode). It prints what it sees in lines that hold no time or
 * address, so that the kernel's run and vmaxdp's compare line by line; a
 * stamp's age and the looped packet's addresses are checked, not printed.
 *
 *   txstamps ADDR PORT
 *
 * It connects a UDP socket to ADDR:PORT and sends 11 datagrams in all.
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
static struct sockaddr_in to, local;

static const char *errname(int e)
{
	return e == EAGAIN ? "EAGAIN" : strerror(e);
}

/* looped says what a packet looped back with its stamp holds: an
 * Ethernet frame of an IPv4 datagram to the peer's address and port from
 * ours, with the payload sent. */
static const char *looped(const unsigned char *f, ssize_t n)
{
	if (n < 14 + 20 + 8 + 8)
		return "short";
	if (f[12] != 0x08 || f[13] != 0x00 || f[14] >> 4 != 4 || f[14 + 9] != IPPROTO_UDP)
		return "not an IPv4 UDP frame";
	int ihl = (f[14] & 0xf) * 4;
	if (memcmp(f + 14 + 12, &local.sin_addr, 4) || memcmp(f + 14 + 16, &to.sin_addr, 4) ||
		memcmp(f + 14 + ihl, &local.sin_port, 2) || memcmp(f + 14 + ihl + 2, &to.sin_port, 2))
		return "WRONG addresses";
	return memcmp(f + 14 + ihl + 8, "stamp me", 8) ? "WRONG payload" : "the frame sent";
}

/* stampInto reads one message of the error queue into a buffer of size
 * bytes and prints it. */
static void stampInto(const char *what, size_t size)
{
	char ctl[256], name[64];
	unsigned char buf[2048];
	struct iovec iov = {.iov_base = buf, .iov_len = size};
	struct msghdr m = {.msg_name = name, .msg_namelen = sizeof name, .msg_control = ctl, .msg_controllen = sizeof ctl,
		.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t r = recvmsg(fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT);
	if (r < 0) {
		printf("%s: errno %s\n", what, errname(errno));
		return;
	}
	printf("%s: ret %zd flags%s%s%s namelen %u\n", what, r, m.msg_flags & MSG_ERRQUEUE ? " MSG_ERRQUEUE" : "",
		m.msg_flags & MSG_CTRUNC ? " MSG_CTRUNC" : "", m.msg_flags & MSG_TRUNC ? " MSG_TRUNC" : "", m.msg_namelen);
	if (r >= 50)
		printf("  packet: %s\n", looped(buf, r));
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
			printf("  IP_RECVERR len %zu: errno %s origin %u type %u code %u info %u data %u offender family %u%s\n",
				(size_t)c->cmsg_len, ee->ee_errno == ENOMSG ? "ENOMSG" : strerror(ee->ee_errno), ee->ee_origin,
				ee->ee_type, ee->ee_code, ee->ee_info, ee->ee_data, off->sin_family,
				off->sin_family == AF_INET ? (off->sin_addr.s_addr == local.sin_addr.s_addr ? " (our address)" : " (WRONG address)") : "");
		} else if (c->cmsg_level == SOL_IP && c->cmsg_type == IP_PKTINFO) {
			struct in_pktinfo *pi = (struct in_pktinfo *)CMSG_DATA(c);
			printf("  IP_PKTINFO len %zu: ifindex %s, spec_dst %s, addr %s\n", (size_t)c->cmsg_len,
				pi->ipi_ifindex > 0 ? "set" : "0",
				pi->ipi_spec_dst.s_addr == local.sin_addr.s_addr ? "ours" : "WRONG",
				pi->ipi_addr.s_addr == to.sin_addr.s_addr ? "the peer's" : "WRONG");
		} else {
			printf("  level %d type %d len %zu\n", c->cmsg_level, c->cmsg_type, (size_t)c->cmsg_len);
		}
	}
}

/* stamp reads one message of the error queue without a buffer. */
static void stamp(const char *what)
{
	stampInto(what, 0);
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
	to = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
	inet_pton(AF_INET, argv[1], &to.sin_addr);
	setflags(SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_TSONLY | SOF_TIMESTAMPING_OPT_ID);
	if (connect(fd, (struct sockaddr *)&to, sizeof to) != 0) {
		perror("connect");
		return 2;
	}
	socklen_t len = sizeof local;
	getsockname(fd, (struct sockaddr *)&local, &len);
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

	int one = 1;
	setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof one);
	setsockopt(fd, SOL_SOCKET, SO_SELECT_ERR_QUEUE, &one, sizeof one);
	setflags(SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_CMSG);
	sendone();
	fd_set x;
	FD_ZERO(&r);
	FD_SET(fd, &r);
	FD_ZERO(&x);
	FD_SET(fd, &x);
	tv = (struct timeval){2, 0};
	n = select(fd + 1, &r, NULL, &x, &tv);
	printf("looped, select: %d, readable %d, exception %d\n", n, FD_ISSET(fd, &r) != 0, FD_ISSET(fd, &x) != 0);
	p = (struct pollfd){.fd = fd, .events = POLLIN | POLLPRI};
	n = poll(&p, 1, 0);
	printf("looped, poll: %d, revents%s%s%s\n", n, p.revents & POLLERR ? " POLLERR" : "", p.revents & POLLPRI ? " POLLPRI" : "",
		p.revents & POLLIN ? " POLLIN" : "");
	stampInto("looped", 2048);
	sendone();
	p.revents = 0;
	poll(&p, 1, 2000);
	stampInto("looped into 20 bytes", 20);

	/* chrony's server in interleaved mode: the socket reports software
	 * stamps but makes none, and each answer asks for its own in its
	 * ancillary data; a send without it is not stamped. */
	setflags(SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_CMSG);
	sendone();
	p.revents = 0;
	printf("per message, a send without: poll %d\n", poll(&p, 1, 100));
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	memset(&u, 0, sizeof u);
	struct iovec iov = {.iov_base = "stamp me", .iov_len = 8};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SO_TIMESTAMPING;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	*(int *)CMSG_DATA(cm) = SOF_TIMESTAMPING_TX_SOFTWARE;
	if (sendmsg(fd, &mh, 0) != 8)
		printf("sendmsg: errno %s\n", errname(errno));
	p.revents = 0;
	n = poll(&p, 1, 2000);
	printf("per message, a send that asks: poll %d, revents%s\n", n, p.revents & POLLERR ? " POLLERR" : "");
	stampInto("per message", 2048);
	stamp("per message, then");
	printf("done\n");
	return 0;
}
