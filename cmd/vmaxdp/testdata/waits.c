/*
 * waits: a UDP echo server that waits for each datagram with another of
 * Linux's multiplexer calls, and checks what each does with its timeout.
 *
 *   waits PORT
 *
 * It binds PORT, prints "ready", and for each wait prints its name, waits
 * up to 5 s for the datagram the test then sends, reads it and echoes it:
 *  - epoll_pwait2, through libc and through syscall(2);
 *  - ppoll and pselect6 through syscall(2), which write the time left
 *    back into their timespec;
 *  - select, which writes it back into its timeval (glibc keeps Linux's
 *    way), and libc's ppoll, which leaves its timespec alone;
 *  - an epoll set nested in another, itself nested in a third, made
 *    before the socket joins it (as an event loop embedded in another's
 *    is): each level reports the one below, beside a pipe, once;
 *  - poll and select on that epoll fd;
 *  - epoll_wait on a duplicate of an epoll fd, then on the fd once the
 *    duplicate is closed;
 *  - poll for POLLRDNORM alone, and epoll for EPOLLRDNORM alone;
 *  - a set nested edge-triggered, reported once for the datagram;
 *  - a set the socket joined under a name closed since, while a
 *    duplicate keeps it open (the socket then goes on under the
 *    duplicate, in every set it had joined);
 * then, with nothing sent, waits that time out (30 ms, the time left
 * written back as 0) and timeouts the kernel refuses (EINVAL); last
 * ("unnested"), a datagram left unread in the nested set, which the sets
 * it was nested in no longer report once it is taken out and closed. Each check
 * prints "ok NAME" or "FAIL NAME: why"; a watchdog ends the program after
 * 20 s. The checks hold on the kernel's sockets as on vmaxdp's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <netinet/in.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "watchdog.h"

static int fd;

static void step(const char *name)
{
	printf("%s\n", name);
	fflush(stdout);
}

/* echo reads the datagram a wait found and sends it back. */
static void echo(const char *name)
{
	char buf[64];
	struct sockaddr_in from;
	socklen_t alen = sizeof from;
	ssize_t n = recvfrom(fd, buf, sizeof buf, MSG_DONTWAIT, (struct sockaddr *)&from, &alen);
	char what[80];
	snprintf(what, sizeof what, "%s-echo", name);
	check(what, n > 0 && sendto(fd, buf, n, 0, (struct sockaddr *)&from, alen) == n, "read and echo the datagram");
}

static long long ns(struct timespec ts) { return ts.tv_sec * 1000000000LL + ts.tv_nsec; }

static long long now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return ns(t);
}

/* written_back: a 5 s timeout came back as what was left of it. */
static int written_back(long long left) { return left > 0 && left < 5000000000LL; }

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	start_watchdog();
	fd = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		perror("socket or bind");
		return 2;
	}
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 42}, out;
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
		perror("epoll");
		return 2;
	}
	/* top holds outer, which holds in and a pipe; the socket joins in
	 * later. */
	int in = epoll_create1(0), outer = epoll_create1(0), top = epoll_create1(0), pipefd[2];
	struct epoll_event e7 = {.events = EPOLLIN, .data.u64 = 7}, e8 = {.events = EPOLLIN, .data.u64 = 8},
			   e9 = {.events = EPOLLIN, .data.u64 = 9};
	if (in < 0 || outer < 0 || top < 0 || pipe(pipefd) != 0 || epoll_ctl(outer, EPOLL_CTL_ADD, in, &e7) != 0 ||
		epoll_ctl(top, EPOLL_CTL_ADD, outer, &e8) != 0 || epoll_ctl(outer, EPOLL_CTL_ADD, pipefd[0], &e9) != 0) {
		perror("nested epoll");
		return 2;
	}
	step("ready");

	struct timespec ts = {5, 0};
	step("epoll_pwait2");
	check("epoll_pwait2", epoll_pwait2(ep, &out, 1, &ts, NULL) == 1 && out.data.u64 == 42, "the socket readable");
	check("epoll_pwait2-kept", ns(ts) == 5000000000LL, "the timespec left alone");
	echo("epoll_pwait2");

	step("sys_epoll_pwait2");
	check("sys_epoll_pwait2", syscall(SYS_epoll_pwait2, ep, &out, 1, &ts, NULL, 0) == 1 && out.data.u64 == 42,
		"the socket readable");
	echo("sys_epoll_pwait2");

	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	step("sys_ppoll");
	check("sys_ppoll", syscall(SYS_ppoll, &pfd, 1, &ts, NULL, 0) == 1 && (pfd.revents & POLLIN), "the socket readable");
	check("sys_ppoll-left", written_back(ns(ts)), "the time left written back");
	echo("sys_ppoll");

	fd_set r;
	ts = (struct timespec){5, 0};
	step("sys_pselect6");
	FD_ZERO(&r);
	FD_SET(fd, &r);
	check("sys_pselect6", syscall(SYS_pselect6, fd + 1, &r, NULL, NULL, &ts, NULL) == 1 && FD_ISSET(fd, &r),
		"the socket readable");
	check("sys_pselect6-left", written_back(ns(ts)), "the time left written back");
	echo("sys_pselect6");

	struct timeval tv = {5, 0};
	step("select");
	FD_ZERO(&r);
	FD_SET(fd, &r);
	check("select", select(fd + 1, &r, NULL, NULL, &tv) == 1 && FD_ISSET(fd, &r), "the socket readable");
	check("select-left", written_back(tv.tv_sec * 1000000000LL + tv.tv_usec * 1000LL), "the time left written back");
	echo("select");

	ts = (struct timespec){5, 0};
	step("ppoll");
	check("ppoll", ppoll(&pfd, 1, &ts, NULL) == 1 && (pfd.revents & POLLIN), "the socket readable");
	check("ppoll-kept", ns(ts) == 5000000000LL, "the timespec left alone");
	echo("ppoll");

	struct epoll_event got[4], e43 = {.events = EPOLLIN, .data.u64 = 43};
	check("nested-join", epoll_ctl(in, EPOLL_CTL_ADD, fd, &e43) == 0, "the socket joins the nested set");
	step("nested");
	int n = epoll_wait(top, got, 4, 5000);
	check("nested", n == 1 && got[0].data.u64 == 8, "the top set reports the middle one");
	n = epoll_wait(outer, got, 4, 0);
	check("nested-outer", n == 1 && got[0].data.u64 == 7, "the middle set reports the nested one");
	n = epoll_wait(in, got, 4, 0);
	check("nested-inner", n == 1 && got[0].data.u64 == 43, "the nested set reports the socket");
	check("nested-pipe", write(pipefd[1], "x", 1) == 1, "write the pipe");
	/* The pipe may wait a few calls: vmaxdp looks at the kernel's fds once
	 * in VMAXDP_SELECT_SKIP_OS calls while its own are ready, as VMA. */
	int each = 1, piped = 0;
	for (int i = 0; i < 8 && !piped; i++) {
		n = epoll_wait(outer, got, 4, 0);
		uint64_t a = n > 0 ? got[0].data.u64 : 0, b = n > 1 ? got[1].data.u64 : 0;
		each &= (n == 1 && a == 7) || (n == 2 && a + b == 16 && a * b == 63);
		piped = n == 2;
	}
	check("nested-mixed", each && piped, "the nested set at each call, the pipe once, none twice in a call");
	echo("nested");
	char c;
	check("nested-drain", read(pipefd[0], &c, 1) == 1, "read the pipe");

	pfd.fd = in;
	step("poll-epfd");
	check("poll-epfd", poll(&pfd, 1, 5000) == 1 && (pfd.revents & POLLIN), "the epoll fd readable");
	echo("poll-epfd");
	pfd.fd = fd;

	tv = (struct timeval){5, 0};
	FD_ZERO(&r);
	FD_SET(in, &r);
	step("select-epfd");
	check("select-epfd", select(in + 1, &r, NULL, NULL, &tv) == 1 && FD_ISSET(in, &r), "the epoll fd readable");
	echo("select-epfd");

	/* A duplicate of an epoll fd names the same set; closing it leaves
	 * the set to its other name. */
	int dupped = dup(ep);
	step("dup-epfd");
	n = epoll_wait(dupped, got, 4, 5000);
	check("dup-epfd", n == 1 && got[0].data.u64 == 42, "the duplicate reports the socket");
	echo("dup-epfd");
	check("dup-close", close(dupped) == 0, "close the duplicate");
	step("dup-closed");
	n = epoll_wait(ep, got, 4, 5000);
	check("dup-closed", n == 1 && got[0].data.u64 == 42, "the set still reports the socket by its first name");
	echo("dup-closed");

	/* POLLRDNORM and EPOLLRDNORM asked alone, as BSD's code asks. */
	pfd.events = POLLRDNORM;
	step("poll-rdnorm");
	check("poll-rdnorm", poll(&pfd, 1, 5000) == 1 && pfd.revents == POLLRDNORM, "POLLRDNORM, and nothing else");
	echo("poll-rdnorm");
	pfd.events = POLLOUT | POLLWRNORM;
	check("poll-wrnorm", poll(&pfd, 1, 0) == 1 && pfd.revents == (POLLOUT | POLLWRNORM), "POLLOUT and POLLWRNORM");
	pfd.events = POLLIN;
	int eprd = epoll_create1(0);
	struct epoll_event erd = {.events = EPOLLRDNORM, .data.u64 = 44};
	check("epoll-rdnorm-add", eprd >= 0 && epoll_ctl(eprd, EPOLL_CTL_ADD, fd, &erd) == 0, "EPOLLRDNORM alone");
	step("epoll-rdnorm");
	n = epoll_wait(eprd, got, 4, 5000);
	check("epoll-rdnorm", n == 1 && got[0].events == EPOLLRDNORM && got[0].data.u64 == 44, "EPOLLRDNORM, and nothing else");
	echo("epoll-rdnorm");

	/* A set nested edge-triggered (EPOLLET on the nested epoll fd) is
	 * reported when a datagram joins it, and not again until another
	 * does, though the one it has is still unread. */
	int etin = epoll_create1(0), etout = epoll_create1(0);
	struct epoll_event e45 = {.events = EPOLLIN, .data.u64 = 45}, e46 = {.events = EPOLLIN | EPOLLET, .data.u64 = 46};
	check("nested-et-add", etin >= 0 && etout >= 0 && epoll_ctl(etin, EPOLL_CTL_ADD, fd, &e45) == 0 &&
		epoll_ctl(etout, EPOLL_CTL_ADD, etin, &e46) == 0, "a set nested with EPOLLET");
	step("nested-et");
	n = epoll_wait(etout, got, 4, 5000);
	check("nested-et", n == 1 && got[0].data.u64 == 46, "reported as the datagram comes");
	n = epoll_wait(etout, got, 4, 30);
	check("nested-et-once", n == 0, "not again while nothing new comes, the datagram unread");
	echo("nested-et");
	close(etout);
	close(etin);

	/* A registration is the open socket's, not its fd number's: closing
	 * the name it was made with, while a duplicate keeps the socket open,
	 * leaves it (and every earlier set's) in place, and it reports the
	 * socket with its data. The socket goes on under the duplicate's
	 * name. */
	int epn = epoll_create1(0), keep = dup(fd);
	struct epoll_event e47 = {.events = EPOLLIN, .data.u64 = 47};
	check("dup-name-add", epn >= 0 && keep >= 0 && epoll_ctl(epn, EPOLL_CTL_ADD, fd, &e47) == 0 && close(fd) == 0,
	      "register, duplicate, close the first name");
	fd = keep;
	pfd.fd = keep;
	step("dup-name");
	n = epoll_wait(epn, got, 4, 5000);
	check("dup-name", n == 1 && got[0].data.u64 == 47, "the registration made through the closed name reports the socket");
	echo("dup-name");
	close(epn);

	/* Nothing is sent from here on, but the last. */
	tv = (struct timeval){0, 30000};
	FD_ZERO(&r);
	FD_SET(fd, &r);
	long long t0 = now();
	n = select(fd + 1, &r, NULL, NULL, &tv);
	check("select-timeout", n == 0 && now() - t0 >= 30000000LL && tv.tv_sec == 0 && tv.tv_usec == 0,
		"0 after 30 ms, nothing left");
	ts = (struct timespec){0, 30000000};
	t0 = now();
	n = (int)syscall(SYS_ppoll, &pfd, 1, &ts, NULL, 0);
	check("sys_ppoll-timeout", n == 0 && now() - t0 >= 30000000LL && ns(ts) == 0, "0 after 30 ms, nothing left");
	ts = (struct timespec){0, 30000000};
	t0 = now();
	n = epoll_pwait2(ep, &out, 1, &ts, NULL);
	check("epoll_pwait2-timeout", n == 0 && now() - t0 >= 30000000LL, "0 after 30 ms");

	ts = (struct timespec){0, 1000000000};
	errno = 0;
	check("epoll_pwait2-einval", epoll_pwait2(ep, &out, 1, &ts, NULL) == -1 && errno == EINVAL, "EINVAL");
	errno = 0;
	check("ppoll-einval", ppoll(&pfd, 1, &ts, NULL) == -1 && errno == EINVAL, "EINVAL");
	tv = (struct timeval){-1, 0};
	errno = 0;
	check("select-einval", select(fd + 1, &r, NULL, NULL, &tv) == -1 && errno == EINVAL, "EINVAL");

	step("unnested");
	check("unnested-wait", epoll_wait(in, got, 4, 5000) == 1, "the datagram queued");
	check("unnested-del", epoll_ctl(outer, EPOLL_CTL_DEL, in, NULL) == 0, "take the nested set out");
	check("unnested", epoll_wait(outer, got, 4, 30) == 0 && epoll_wait(top, got, 4, 0) == 0,
		"nothing reported above the set taken out");
	check("unnested-add", epoll_ctl(outer, EPOLL_CTL_ADD, in, &e7) == 0 && epoll_wait(top, got, 4, 0) == 1,
		"reported again once put back");
	check("unnested-close", close(in) == 0 && epoll_wait(outer, got, 4, 30) == 0 && epoll_wait(top, got, 4, 0) == 0,
		"nothing reported once it is closed");
	echo("unnested");
	return failed;
}
