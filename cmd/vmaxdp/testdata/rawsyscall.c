/*
 * rawsyscall: a UDP echo server that makes every socket call through
 * syscall(2) rather than libc's names, as libuv before 1.45 does for
 * recvmmsg and sendmmsg (BIND 9.18's named).
 *
 *   rawsyscall PORT
 *
 * It makes its socket and binds PORT, prints "ready", and echoes what the
 * test sends, each exchange with other calls:
 *  - recvfrom, then sendto ("one");
 *  - recvmmsg of two, then sendmmsg of both ("two", "thr");
 *  - epoll_create1, epoll_ctl and epoll_wait, then read and sendmsg
 *    ("four");
 *  - poll, then recvmsg and sendto ("five");
 * then checks getsockname and close. Each check prints "ok NAME" or
 * "FAIL NAME: why"; a watchdog ends the program after 20 s.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <netinet/in.h>
#include <unistd.h>

#include "check.h"
#include "watchdog.h"


int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	start_watchdog();
	int port = atoi(argv[1]);
	int fd = (int)syscall(SYS_socket, AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (fd < 0 || syscall(SYS_bind, fd, &sa, sizeof sa) != 0) {
		perror("socket or bind");
		return 2;
	}
	printf("ready\n");
	fflush(stdout);

	char buf[64];
	struct sockaddr_in from;
	socklen_t alen = sizeof from;
	long n = syscall(SYS_recvfrom, fd, buf, sizeof buf, 0, &from, &alen);
	check("recvfrom", n == 3 && memcmp(buf, "one", 3) == 0, "want \"one\"");
	check("sendto", syscall(SYS_sendto, fd, buf, n, 0, &from, alen) == n, "echo");

	char bufs[2][64];
	struct iovec iov[2];
	struct mmsghdr v[2];
	struct sockaddr_in froms[2];
	memset(v, 0, sizeof v);
	for (int i = 0; i < 2; i++) {
		iov[i] = (struct iovec){bufs[i], sizeof bufs[i]};
		v[i].msg_hdr.msg_iov = &iov[i];
		v[i].msg_hdr.msg_iovlen = 1;
		v[i].msg_hdr.msg_name = &froms[i];
		v[i].msg_hdr.msg_namelen = sizeof froms[i];
	}
	long got = syscall(SYS_recvmmsg, fd, v, 2, 0, NULL);
	check("recvmmsg", got == 2 && v[0].msg_len == 3 && memcmp(bufs[0], "two", 3) == 0 && v[1].msg_len == 3 &&
		memcmp(bufs[1], "thr", 3) == 0, "want \"two\" and \"thr\"");
	for (int i = 0; i < 2; i++)
		iov[i].iov_len = v[i].msg_len;
	check("sendmmsg", syscall(SYS_sendmmsg, fd, v, 2, 0) == 2, "echo both");

	int ep = (int)syscall(SYS_epoll_create1, EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 42};
	check("epoll_ctl", ep >= 0 && syscall(SYS_epoll_ctl, ep, EPOLL_CTL_ADD, fd, &ev) == 0, "add the socket");
	printf("epoll\n");
	fflush(stdout);
	struct epoll_event out;
	check("epoll_wait", syscall(SYS_epoll_wait, ep, &out, 1, 5000) == 1 && out.data.u64 == 42, "the socket readable");
	n = syscall(SYS_read, fd, buf, sizeof buf);
	check("read", n == 4 && memcmp(buf, "four", 4) == 0, "want \"four\"");
	struct iovec one = {buf, (size_t)n};
	struct msghdr msg = {.msg_name = &from, .msg_namelen = alen, .msg_iov = &one, .msg_iovlen = 1};
	check("sendmsg", syscall(SYS_sendmsg, fd, &msg, 0) == n, "echo");

	printf("poll\n");
	fflush(stdout);
	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	check("poll", syscall(SYS_poll, &pfd, 1, 5000) == 1 && (pfd.revents & POLLIN), "the socket readable");
	one.iov_len = sizeof buf;
	msg.msg_namelen = sizeof from;
	n = syscall(SYS_recvmsg, fd, &msg, 0);
	check("recvmsg", n == 4 && memcmp(buf, "five", 4) == 0, "want \"five\"");
	check("sendto-after-poll", syscall(SYS_sendto, fd, buf, n, 0, &from, alen) == n, "echo");

	struct sockaddr_in me;
	alen = sizeof me;
	check("getsockname", syscall(SYS_getsockname, fd, &me, &alen) == 0 && ntohs(me.sin_port) == port, "the bound port");
	check("close", syscall(SYS_close, fd) == 0 && syscall(SYS_close, ep) == 0, "both fds");
	return failed;
}
