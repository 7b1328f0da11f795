/* tcpcalls: TCP socket calls with the kernel's semantics, as a transcript.
 *
 *   tcpcalls server PORT
 *   tcpcalls client ADDR PORT CLOSED_PORT
 *   tcpcalls backlog PORT N     (backlog 4, accepts after 0.5 s, serves N)
 *   tcpcalls vanish PORT        (the peer vanishes: user timeout, keepalive)
 *   tcpcalls handover PORT FILE (SO_REUSEPORT; accepts once FILE exists, exits once it is gone)
 *
 * Each side prints what every call returned (values, errno names, event
 * masks), never a time or a number that varies between runs, so that the
 * transcript of a run on the kernel and one under vmaxdp run must be the
 * same, line for line (TestRunTCPCalls). Both sides pace each other
 * through the connection itself. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <linux/sockios.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "transcript.h"
#include "watchdog.h"

/* res prints a call's result: its value, or -1 and the errno's name. */
static long res(const char *what, long r)
{
	if (r < 0)
		say("%s = -1 %s", what, strerrorname_np(errno));
	else
		say("%s = %ld", what, r);
	return r;
}

static void die(const char *what)
{
	say("FAIL %s: %s", what, strerrorname_np(errno));
	exit(1);
}

/* readn reads exactly n bytes (blocking). */
static void readn(int fd, char *b, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = read(fd, b + got, n - got);
		if (r <= 0)
			die("readn");
		got += (size_t)r;
	}
}

static void writen(int fd, const char *b, size_t n)
{
	if (write(fd, b, n) != (ssize_t)n)
		die("writen");
}

static int sigpipes;
static void on_sigpipe(int sig)
{
	(void)sig;
	sigpipes++;
}

static const char *evnames(unsigned ev)
{
	static char b[128];
	b[0] = 0;
	if (ev & EPOLLIN) strcat(b, "IN ");
	if (ev & EPOLLOUT) strcat(b, "OUT ");
	if (ev & EPOLLRDHUP) strcat(b, "RDHUP ");
	if (ev & EPOLLHUP) strcat(b, "HUP ");
	if (ev & EPOLLERR) strcat(b, "ERR ");
	return b;
}

static void setint(int fd, int level, int name, int v)
{
	setsockopt(fd, level, name, &v, sizeof v);
}

static int getint(int fd, int level, int name)
{
	int v = 0;
	socklen_t vl = sizeof v;
	if (getsockopt(fd, level, name, &v, &vl) < 0)
		return -1000 - errno; /* a failure shows in the transcript */
	return v;
}

/* set_options sets the options options() prints (keepalive idle,
 * interval and count, user timeout in ms) and TCP_NODELAY, SO_KEEPALIVE,
 * a 64 KB SO_RCVBUF, SYN retries, FIN-WAIT-2 time, TOS and TTL. */
static void set_options(int fd, int idle, int intvl, int cnt, int uto)
{
	setint(fd, IPPROTO_TCP, TCP_SYNCNT, 3);
	setint(fd, IPPROTO_TCP, TCP_LINGER2, 20);
	setint(fd, IPPROTO_IP, IP_TOS, 0x10);
	setint(fd, IPPROTO_IP, IP_TTL, 33);
	setint(fd, IPPROTO_TCP, TCP_NODELAY, 1);
	setint(fd, SOL_SOCKET, SO_KEEPALIVE, 1);
	setint(fd, IPPROTO_TCP, TCP_KEEPIDLE, idle);
	setint(fd, IPPROTO_TCP, TCP_KEEPINTVL, intvl);
	setint(fd, IPPROTO_TCP, TCP_KEEPCNT, cnt);
	setint(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, uto);
	setint(fd, SOL_SOCKET, SO_RCVBUF, 65536);
	setint(fd, IPPROTO_TCP, TCP_WINDOW_CLAMP, 40000);
}

/* chosen prints TCP_CONGESTION and TCP_WINDOW_CLAMP, once set: a fresh
 * socket's are the kernel's own (its default algorithm may be one netstack
 * lacks, bbr). set_options sets the clamp; TCP_CONGESTION is set on the
 * connection before connect and after accept, not on the listener: the
 * algorithm decides how much the zero window's writer buffers. */
static const char *chosen(int fd)
{
	static char out[128];
	char cc[16] = "?";
	socklen_t cl = sizeof cc;
	if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, &cl) < 0)
		snprintf(cc, sizeof cc, "%s", strerrorname_np(errno));
	snprintf(out, sizeof out, "TCP_CONGESTION %s TCP_WINDOW_CLAMP %d", cc, getint(fd, IPPROTO_TCP, TCP_WINDOW_CLAMP));
	return out;
}

/* negotiated prints what the handshake agreed: the MSS in the range a
 * 1500-byte MTU gives with options (the kernel's 1448 with timestamps,
 * netstack's 1420: it keeps room for SACK blocks too), as TCP_MAXSEG and
 * TCP_INFO read it, and the options (timestamps, SACK, window scaling). */
static const char *negotiated(int fd)
{
	static char out[128];
	struct tcp_info ti = {0};
	socklen_t tl = sizeof ti;
	getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl);
	int mss = getint(fd, IPPROTO_TCP, TCP_MAXSEG);
	snprintf(out, sizeof out, "TCP_MAXSEG 1400-1460 %d tcpi_snd_mss 1400-1460 %d tcpi_advmss %u tcpi_options %d",
		 mss >= 1400 && mss <= 1460, ti.tcpi_snd_mss >= 1400 && ti.tcpi_snd_mss <= 1460, ti.tcpi_advmss,
		 ti.tcpi_options & (TCPI_OPT_TIMESTAMPS | TCPI_OPT_SACK | TCPI_OPT_WSCALE));
	return out;
}

/* options prints the options a socket inherits or keeps from before
 * connect. */
static const char *options(int fd)
{
	static char out[512];
	struct linger lg = {0};
	socklen_t ll = sizeof lg;
	getsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, &ll);
	snprintf(out, sizeof out,
		 "TCP_NODELAY %d SO_KEEPALIVE %d TCP_KEEPIDLE %d TCP_KEEPINTVL %d TCP_KEEPCNT %d TCP_USER_TIMEOUT %d "
		 "SO_RCVBUF at least 128 KB %d SO_LINGER %d %d TCP_SYNCNT %d TCP_LINGER2 %d IP_TOS %d IP_TTL %d "
		 "TCP_QUICKACK %d",
		 getint(fd, IPPROTO_TCP, TCP_NODELAY) != 0, getint(fd, SOL_SOCKET, SO_KEEPALIVE) != 0,
		 getint(fd, IPPROTO_TCP, TCP_KEEPIDLE), getint(fd, IPPROTO_TCP, TCP_KEEPINTVL),
		 getint(fd, IPPROTO_TCP, TCP_KEEPCNT), getint(fd, IPPROTO_TCP, TCP_USER_TIMEOUT),
		 getint(fd, SOL_SOCKET, SO_RCVBUF) >= 131072, lg.l_onoff, lg.l_linger,
		 getint(fd, IPPROTO_TCP, TCP_SYNCNT), getint(fd, IPPROTO_TCP, TCP_LINGER2),
		 getint(fd, IPPROTO_IP, IP_TOS), getint(fd, IPPROTO_IP, IP_TTL), getint(fd, IPPROTO_TCP, TCP_QUICKACK));
	return out;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int server(int port)
{
	int l = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (bind(l, (struct sockaddr *)&a, sizeof a) < 0)
		die("bind");
	res("listen", listen(l, 8));
	/* Set on the listener after listen: its connections inherit them. */
	set_options(l, 40, 8, 4, 6000);
	say("listening");
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = l};
	epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev);

	/* 1: data calls. */
	struct epoll_event out[4];
	int n = epoll_wait(ep, out, 4, 10000);
	say("epoll listener: %d %s", n, n == 1 && out[0].data.fd == l ? evnames(out[0].events) : "?");
	struct sockaddr_in peer;
	socklen_t plen = sizeof peer;
	int c = accept4(l, (struct sockaddr *)&peer, &plen, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (c < 0)
		die("accept4");
	say("accept4: fd %d, peer len %u, family %d, nonblock %d, cloexec %d", c, plen, peer.sin_family,
	    (fcntl(c, F_GETFL) & O_NONBLOCK) != 0, (fcntl(c, F_GETFD) & FD_CLOEXEC) != 0);
	struct stat st;
	say("fstat: socket %d", fstat(c, &st) == 0 && S_ISSOCK(st.st_mode));
	say("inherited from the listener: %s", options(c));
	say("inherited from the listener: TCP_WINDOW_CLAMP %d", getint(c, IPPROTO_TCP, TCP_WINDOW_CLAMP));
	say("negotiated: %s", negotiated(c));
	res("TCP_CONGESTION reno", setsockopt(c, IPPROTO_TCP, TCP_CONGESTION, "reno", 4));
	res("TCP_CONGESTION nosuch", setsockopt(c, IPPROTO_TCP, TCP_CONGESTION, "nosuch", 6));
	say("after: %s", chosen(c));
	/* One the kernel has (its default here) and netstack lacks: taken,
	 * as the kernel takes it, without effect on netstack, which keeps
	 * reno; unprinted, since the two then differ. */
	res("TCP_CONGESTION bbr", setsockopt(c, IPPROTO_TCP, TCP_CONGESTION, "bbr", 3));
	struct sockaddr_in me, pp;
	socklen_t ml = sizeof me, pl = sizeof pp;
	getsockname(c, (struct sockaddr *)&me, &ml);
	getpeername(c, (struct sockaddr *)&pp, &pl);
	say("names: local port %d, peer is accept's %d", ntohs(me.sin_port),
	    pp.sin_addr.s_addr == peer.sin_addr.s_addr && pp.sin_port == peer.sin_port);
	int v;
	socklen_t vl = sizeof v;
	getsockopt(c, SOL_SOCKET, SO_TYPE, &v, &vl);
	say("SO_TYPE %d", v);
	vl = sizeof v;
	getsockopt(c, SOL_SOCKET, SO_ERROR, &v, &vl);
	say("SO_ERROR %d", v);
	setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	vl = sizeof v;
	getsockopt(c, IPPROTO_TCP, TCP_NODELAY, &v, &vl);
	say("TCP_NODELAY %d", v != 0);
	setsockopt(c, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
	vl = sizeof v;
	getsockopt(c, SOL_SOCKET, SO_KEEPALIVE, &v, &vl);
	say("SO_KEEPALIVE %d", v != 0);
	int idle = 30;
	setsockopt(c, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
	vl = sizeof v;
	getsockopt(c, IPPROTO_TCP, TCP_KEEPIDLE, &v, &vl);
	say("TCP_KEEPIDLE %d", v);
	struct tcp_info ti;
	socklen_t tl = sizeof ti;
	getsockopt(c, IPPROTO_TCP, TCP_INFO, &ti, &tl);
	say("TCP_INFO state %d", ti.tcpi_state);
	char b[2048];
	res("recv before data", recv(c, b, sizeof b, 0));

	ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
	ev.data.fd = c;
	epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
	writen(c, "go1", 3);
	n = epoll_wait(ep, out, 4, 10000);
	say("epoll data: %d %s", n, n == 1 && out[0].data.fd == c ? evnames(out[0].events) : "?");
	usleep(100000); /* all 11 bytes in */
	ioctl(c, FIONREAD, &v);
	say("FIONREAD %d", v);
	res("recv peek 5", recv(c, b, 5, MSG_PEEK));
	say("peeked %.5s", b);
	res("recv 5", recv(c, b, 5, 0));
	say("read %.5s", b);
	long r = res("recv rest", recv(c, b, sizeof b, 0));
	say("read %.*s", (int)(r > 0 ? r : 0), b);
	res("recv empty", recv(c, b, sizeof b, MSG_DONTWAIT));
	n = epoll_wait(ep, out, 4, 0);
	say("epoll after draining (edge-triggered): %d", n);

	/* Blocking, MSG_WAITALL over paced writes. */
	fcntl(c, F_SETFL, fcntl(c, F_GETFL) & ~O_NONBLOCK);
	writen(c, "go2", 3);
	r = res("recv waitall 1000", recv(c, b, 1000, MSG_WAITALL));
	int okb = r == 1000;
	for (int i = 0; okb && i < 1000; i++)
		okb = b[i] == (char)(i * 7);
	say("waitall content %d", okb);

	/* readv and writev. */
	writen(c, "go3", 3);
	char x[10], y[10], z[10];
	struct iovec iv[3] = {{x, 10}, {y, 10}, {z, 10}};
	r = res("readv", readv(c, iv, 3));
	while (r >= 0 && r < 30) {
		/* The peer wrote 30 bytes at once; a short read may split them. */
		char *p = r < 10 ? x + r : r < 20 ? y + r - 10 : z + r - 20;
		ssize_t k = read(c, p, (size_t)(r < 10 ? 10 - r : r < 20 ? 20 - r : 30 - r));
		if (k <= 0)
			break;
		r += k;
	}
	say("readv content %.10s|%.10s|%.10s", x, y, z);
	struct iovec ov[3] = {{z, 10}, {y, 10}, {x, 10}};
	res("writev", writev(c, ov, 3));

	/* sendmsg and recvmsg. */
	char m[16];
	struct iovec mv = {m, sizeof m};
	struct msghdr mh = {.msg_iov = &mv, .msg_iovlen = 1};
	r = res("recvmsg", recvmsg(c, &mh, 0));
	say("recvmsg %.*s namelen %u flags %d", (int)(r > 0 ? r : 0), m, mh.msg_namelen, mh.msg_flags);
	struct iovec sv = {"pong", 4};
	struct msghdr sh = {.msg_iov = &sv, .msg_iovlen = 1};
	res("sendmsg", sendmsg(c, &sh, 0));

	/* Non-blocking receives that spin until data comes, the first for
	 * part of it: a wait in the kernel (a raw ppoll, which no
	 * interposer sees) finds the rest readable, and nothing once it is
	 * read. */
	fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK);
	writen(c, "go5", 3);
	double until = now() + 10;
	while ((r = recv(c, b, 4, 0)) < 0 && errno == EAGAIN && now() < until)
		;
	res("spinning recv 4", r);
	struct pollfd kp = {.fd = c, .events = POLLIN};
	struct timespec zero = {0, 0};
	long k = syscall(SYS_ppoll, &kp, 1, &zero, NULL, 8);
	say("kernel's poll after a part: %ld %s", k, (kp.revents & POLLIN) ? "IN" : "-");
	while ((r = recv(c, b, sizeof b, 0)) < 0 && errno == EAGAIN && now() < until)
		;
	res("spinning recv rest", r);
	kp.revents = 0;
	k = syscall(SYS_ppoll, &kp, 1, &zero, NULL, 8);
	say("kernel's poll after the rest: %ld %s", k, (kp.revents & POLLIN) ? "IN" : "-");
	fcntl(c, F_SETFL, fcntl(c, F_GETFL) & ~O_NONBLOCK);

	/* A level-triggered member of one epoll set, as an event loop has
	 * it, whose waits spin on EPOLLOUT until the data comes: they report
	 * it in one event with EPOLLOUT; poll sees it before it is read;
	 * after EPOLL_CTL_DEL with it unread, a raw ppoll sees it, after a
	 * part is read the rest, and nothing once all is; a raw ppoll sees it
	 * once the set is closed; and a wait of the set that a second set of
	 * connections (of a second connection, accepted meanwhile) leaves to
	 * the kernel reports it. */
	epoll_ctl(ep, EPOLL_CTL_DEL, c, NULL);
	int ep2 = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event lev = {.events = EPOLLIN | EPOLLOUT, .data.fd = c};
	epoll_ctl(ep2, EPOLL_CTL_ADD, c, &lev);
	for (int round = 6; round <= 9; round++) {
		char go[4];
		snprintf(go, sizeof go, "go%d", round);
		writen(c, go, 3);
		until = now() + 10;
		do
			n = epoll_wait(ep2, out, 4, 1000);
		while (n == 1 && !(out[0].events & EPOLLIN) && now() < until);
		say("level-triggered epoll, %s: %d %s", go, n, n == 1 && out[0].data.fd == c ? evnames(out[0].events) : "?");
		usleep(100000); /* all 10 bytes in */
		if (round == 6) {
			struct pollfd lp = {.fd = c, .events = POLLIN};
			n = poll(&lp, 1, 0);
			say("poll after it: %d %s", n, (lp.revents & POLLIN) ? "IN" : "-");
			res("recv it", recv(c, b, sizeof b, 0));
			continue;
		}
		if (round == 8) {
			close(ep2);
			kp.revents = 0;
			k = syscall(SYS_ppoll, &kp, 1, &zero, NULL, 8);
			say("kernel's poll after closing the set: %ld %s", k, (kp.revents & POLLIN) ? "IN" : "-");
			res("recv it", recv(c, b, sizeof b, 0));
			ep2 = epoll_create1(EPOLL_CLOEXEC);
			epoll_ctl(ep2, EPOLL_CTL_ADD, c, &lev);
			continue;
		}
		if (round == 9) {
			/* Options set on the listener after it accepted: the
			 * connections that come after have them (the next
			 * one, 2 below; c2 was made before, and has the old). */
			setint(l, IPPROTO_TCP, TCP_KEEPIDLE, 50);
			setint(l, IPPROTO_TCP, TCP_KEEPCNT, 6);
			int c2 = accept(l, NULL, NULL);
			say("second connection accepted: %d", c2 >= 0);
			int ep3 = epoll_create1(EPOLL_CLOEXEC);
			struct epoll_event ev3 = {.events = EPOLLIN, .data.fd = c2};
			epoll_ctl(ep3, EPOLL_CTL_ADD, c2, &ev3);
			n = epoll_wait(ep2, out, 4, 0);
			say("level-triggered epoll beside a second set: %d %s", n, n == 1 && out[0].data.fd == c ? evnames(out[0].events) : "?");
			res("recv it", recv(c, b, sizeof b, 0));
			close(ep3);
			close(c2);
			continue;
		}
		/* round 7 */
		epoll_ctl(ep2, EPOLL_CTL_DEL, c, NULL);
		kp.revents = 0;
		k = syscall(SYS_ppoll, &kp, 1, &zero, NULL, 8);
		say("kernel's poll after EPOLL_CTL_DEL: %ld %s", k, (kp.revents & POLLIN) ? "IN" : "-");
		res("recv 4 of it", recv(c, b, 4, 0));
		kp.revents = 0;
		k = syscall(SYS_ppoll, &kp, 1, &zero, NULL, 8);
		say("kernel's poll after a part: %ld %s", k, (kp.revents & POLLIN) ? "IN" : "-");
		res("recv the rest", recv(c, b, sizeof b, 0));
		kp.revents = 0;
		k = syscall(SYS_ppoll, &kp, 1, &zero, NULL, 8);
		say("kernel's poll after the rest: %ld %s", k, (kp.revents & POLLIN) ? "IN" : "-");
		epoll_ctl(ep2, EPOLL_CTL_ADD, c, &lev);
	}
	close(ep2);
	ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
	ev.data.fd = c;
	epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);

	/* splice from the connection into a pipe and from a pipe onto it,
	 * sendfile onto it. */
	int pipefd[2];
	if (pipe(pipefd) < 0)
		die("pipe");
	writen(c, "go4", 3);
	long spliced = 0;
	while (spliced < 20) {
		r = splice(c, NULL, pipefd[1], NULL, (size_t)(20 - spliced), 0);
		if (r <= 0) {
			res("splice into a pipe", r);
			break;
		}
		spliced += r;
	}
	readn(pipefd[0], b, (size_t)spliced);
	say("spliced into a pipe: %ld %.*s", spliced, (int)spliced, b);
	writen(pipefd[1], "spliced-back", 12);
	loff_t lo = 0;
	res("splice with an offset", splice(pipefd[0], &lo, c, NULL, 12, 0));
	res("splice onto the connection", splice(pipefd[0], NULL, c, NULL, 12, 0));
	res("splice of an empty pipe, SPLICE_F_NONBLOCK", splice(pipefd[0], NULL, c, NULL, 12, SPLICE_F_NONBLOCK));
	close(pipefd[0]);
	close(pipefd[1]);
	char path[] = "/tmp/tcpcalls.XXXXXX";
	int f = mkstemp(path);
	if (f < 0)
		die("mkstemp");
	unlink(path);
	writen(f, "file-contents-0123", 18);
	off_t off = 2;
	res("sendfile", sendfile(c, f, &off, 16));
	say("sendfile offset %ld", (long)off);
	close(f);

	/* The peer shuts its sending side: EPOLLRDHUP, then end of file. */
	ev.events = EPOLLIN | EPOLLRDHUP;
	epoll_ctl(ep, EPOLL_CTL_MOD, c, &ev);
	n = epoll_wait(ep, out, 4, 10000);
	say("epoll after peer's FIN: %d %s", n, n == 1 ? evnames(out[0].events & (EPOLLIN | EPOLLRDHUP)) : "?");
	res("recv at end", recv(c, b, sizeof b, 0));
	res("send after peer's FIN", send(c, "bye", 3, 0));
	res("shutdown SHUT_WR", shutdown(c, SHUT_WR));
	res("send after SHUT_WR", send(c, "x", 1, MSG_NOSIGNAL));
	say("sigpipe %d", sigpipes);
	res("send after SHUT_WR, with SIGPIPE", send(c, "x", 1, 0));
	say("sigpipe %d", sigpipes);
	epoll_ctl(ep, EPOLL_CTL_DEL, c, NULL);
	res("close", close(c));

	/* 2: the peer resets (SO_LINGER 0). */
	c = accept(l, NULL, NULL);
	say("accept: fd %d", c);
	say("inherited from the listener, changed: %s", options(c));
	struct pollfd pf = {.fd = c, .events = POLLIN};
	n = poll(&pf, 1, 10000);
	say("poll before reset: %d", n);
	readn(c, b, 3);
	writen(c, "ok", 2);
	pf.revents = 0;
	n = poll(&pf, 1, 10000);
	/* POLLIN or not at a reset is the kernel's race (the error is
	 * reported before the shutdown is set): either wakes the reader. */
	say("poll at reset: %d %s", n, (pf.revents & (POLLIN | POLLERR | POLLHUP)) ? "IN/ERR/HUP" : "-");
	res("recv at reset", recv(c, b, sizeof b, 0));
	res("recv after reset", recv(c, b, sizeof b, 0));
	res("send after reset", send(c, "x", 1, MSG_NOSIGNAL));
	close(c);

	/* 3: close with unread data resets the connection. */
	c = accept(l, NULL, NULL);
	say("accept: fd %d", c);
	readn(c, b, 3);
	writen(c, "ok", 2);
	usleep(200000); /* the peer's 100 bytes are in, unread */
	res("close with unread data", close(c));

	/* 4: SO_LINGER 0 on our side: close resets. */
	c = accept(l, NULL, NULL);
	say("accept: fd %d", c);
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	res("SO_LINGER", setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg));
	readn(c, b, 3);
	res("close with SO_LINGER 0", close(c));

	/* 5: a zero window: the reader stops; writes fill the send buffer
	 * to EAGAIN, and EPOLLOUT comes when the reader drains it. */
	c = accept(l, NULL, NULL);
	say("accept: fd %d", c);
	fcntl(c, F_SETFL, O_NONBLOCK);
	static char chunk[65536];
	long sent = 0;
	for (;;) {
		for (int i = 0; i < (int)sizeof chunk; i++)
			chunk[i] = (char)((sent + i) % 251);
		ssize_t w = write(c, chunk, sizeof chunk);
		if (w <= 0)
			break;
		sent += w;
	}
	say("write until full: %s", errno == EAGAIN ? "EAGAIN" : strerrorname_np(errno));
	int outq = -1;
	res("SIOCOUTQ", ioctl(c, SIOCOUTQ, &outq));
	say("SIOCOUTQ with the reader stopped: more than 0 %d", outq > 0);
	ev.events = EPOLLOUT | EPOLLET;
	ev.data.fd = c;
	epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
	n = epoll_wait(ep, out, 4, 10000);
	say("epoll after the reader drained: %d %s", n, n == 1 ? evnames(out[0].events & EPOLLOUT) : "?");
	fcntl(c, F_SETFL, 0);
	for (int i = 0; i < 1000; i++)
		chunk[i] = (char)((sent + i) % 251);
	writen(c, chunk, 1000);
	shutdown(c, SHUT_WR);
	readn(c, b, 2);
	/* The reader read all, then wrote: all is acknowledged. */
	res("SIOCOUTQ", ioctl(c, SIOCOUTQ, &outq));
	say("SIOCOUTQ once the reader has all: %d", outq);
	close(c);

	/* 6: the client waits out its SO_RCVTIMEO, then closes. */
	c = accept(l, NULL, NULL);
	say("accept: fd %d", c);
	res("read until the client closes", read(c, b, sizeof b));
	close(c);

	close(l);
	close(ep);
	say("server done");
	return 0;
}

/* echo_one accepts a connection on l and echoes its first read. */
static void echo_one(int l)
{
	int c = accept(l, NULL, NULL);
	if (c < 0)
		die("accept");
	char b[64];
	ssize_t r = read(c, b, sizeof b);
	if (r > 0)
		writen(c, b, (size_t)r);
	close(c);
}

/* listener: a listening socket on port with backlog, or the program
 * dies. */
static int listener(int port, int backlog)
{
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, backlog) < 0)
		die("listen");
	return l;
}

/* backlog: a listener with a backlog of 4 accepts nothing for half a
 * second, then serves n connections, each echoing one read. */
static int backlog(int port, int n)
{
	int l = listener(port, 4);
	say("listening");
	usleep(500000);
	for (int i = 0; i < n; i++)
		echo_one(l);
	say("ok served %d", n);
	return 0;
}

/* handover: a SO_REUSEPORT listener that accepts nothing until the file
 * named go exists, then echoes one read of each connection until none
 * comes for a second, and keeps the listener open until the file is gone
 * (the test waits for the end of the handover in the log first). */
static int handover(int port, const char *go)
{
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 64) < 0)
		die("listen");
	say("listening");
	struct stat st;
	while (stat(go, &st) != 0)
		usleep(10000);
	struct timeval tv = {.tv_sec = 1};
	setsockopt(l, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	int n = 0;
	for (;;) {
		int c = accept(l, NULL, NULL);
		if (c < 0)
			break;
		char b[64];
		ssize_t r = read(c, b, sizeof b);
		if (r > 0)
			writen(c, b, (size_t)r);
		close(c);
		n++;
	}
	say("ok served %d", n);
	for (int i = 0; i < 2000 && stat(go, &st) == 0; i++)
		usleep(10000);
	return 0;
}


/* vanish: the peer disappears for good after the first exchange of each
 * connection (the test takes its address away when it has read "ok").
 * Connection 1 sends with TCP_USER_TIMEOUT 1500 ms until a send fails;
 * connection 2 waits in read with keepalive (1 s idle, 1 s interval, 2
 * probes). Each prints the errno that ended it and whether it came
 * within the bound (the kernel's: 1.5 s and 3 s, give or take its
 * retransmission timer). */
static int vanish(int port)
{
	int l = listener(port, 4);
	say("listening");
	char b[64];

	int c = accept(l, NULL, NULL);
	if (c < 0)
		die("accept 1");
	readn(c, b, 2);
	int uto = 1500;
	res("TCP_USER_TIMEOUT", setsockopt(c, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof uto));
	writen(c, "ok", 2);
	double t0 = now();
	int err = 0;
	while (now() - t0 < 15) {
		if (send(c, "x", 1, MSG_NOSIGNAL) < 0) {
			err = errno;
			break;
		}
		usleep(100000);
	}
	double t = now() - t0;
	say("user timeout: send %s, within 1-8 s %d", err ? strerrorname_np(err) : "never failed", t >= 1 && t <= 8);
	res("send after", send(c, "x", 1, MSG_NOSIGNAL));
	close(c);
	say("vanished 1");

	c = accept(l, NULL, NULL);
	if (c < 0)
		die("accept 2");
	readn(c, b, 2);
	setint(c, SOL_SOCKET, SO_KEEPALIVE, 1);
	setint(c, IPPROTO_TCP, TCP_KEEPIDLE, 1);
	setint(c, IPPROTO_TCP, TCP_KEEPINTVL, 1);
	setint(c, IPPROTO_TCP, TCP_KEEPCNT, 2);
	writen(c, "ok", 2);
	t0 = now();
	struct pollfd pf = {.fd = c, .events = POLLIN};
	int n = poll(&pf, 1, 15000);
	t = now() - t0;
	say("keepalive: poll %d %s, within 2-10 s %d", n, (pf.revents & (POLLERR | POLLHUP)) ? "ERR/HUP" : "-", t >= 2 && t <= 10);
	res("recv", recv(c, b, sizeof b, 0));
	close(c);
	say("vanished 2");
	return 0;
}

static int client(const char *addr, int port, int closed)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	inet_pton(AF_INET, addr, &a.sin_addr);
	char b[2048];

	int c = socket(AF_INET, SOCK_STREAM, 0);
	res("connect", connect(c, (struct sockaddr *)&a, sizeof a));
	struct sockaddr_in me, pp;
	socklen_t ml = sizeof me, pl = sizeof pp;
	getsockname(c, (struct sockaddr *)&me, &ml);
	getpeername(c, (struct sockaddr *)&pp, &pl);
	say("names: local bound %d, peer port %d", me.sin_port != 0, ntohs(pp.sin_port));
	/* Nothing set: the kernel's defaults (Nagle on among them). */
	say("defaults after connect: %s", options(c));
	readn(c, b, 3); /* go1 */
	writen(c, "hello", 5);
	usleep(20000);
	writen(c, " world", 6);
	readn(c, b, 3); /* go2 */
	for (int i = 0; i < 1000; i++)
		b[i] = (char)(i * 7);
	for (int i = 0; i < 10; i++) {
		writen(c, b + i * 100, 100);
		usleep(10000);
	}
	readn(c, b, 3); /* go3 */
	writen(c, "0123456789abcdefghijKLMNOPQRST", 30);
	readn(c, b, 30);
	say("writev came back %.30s", b);
	writen(c, "ping", 4);
	readn(c, b, 4);
	say("sendmsg came back %.4s", b);
	readn(c, b, 3); /* go5 */
	writen(c, "partial-read", 12);
	readn(c, b, 3); /* go6 */
	writen(c, "level-data", 10);
	readn(c, b, 3); /* go7 */
	writen(c, "level-more", 10);
	readn(c, b, 3); /* go8 */
	writen(c, "level-clos", 10);
	readn(c, b, 3); /* go9 */
	/* The second connection is in the listener's queue before the
	 * data that makes the server accept it. */
	int c2 = socket(AF_INET, SOCK_STREAM, 0);
	res("connect a second", connect(c2, (struct sockaddr *)&a, sizeof a));
	writen(c, "level-pass", 10);
	close(c2);
	readn(c, b, 3); /* go4 */
	writen(c, "splice-from-the-peer", 20);
	readn(c, b, 12);
	say("splice came back %.12s", b);
	readn(c, b, 16);
	say("sendfile came %.16s", b);
	res("shutdown SHUT_WR", shutdown(c, SHUT_WR));
	readn(c, b, 3);
	say("read after our FIN %.3s", b);
	res("recv at peer's FIN", recv(c, b, sizeof b, 0));
	close(c);

	/* 2: reset by us. */
	c = socket(AF_INET, SOCK_STREAM, 0);
	res("connect 2", connect(c, (struct sockaddr *)&a, sizeof a));
	writen(c, "rst", 3);
	readn(c, b, 2);
	struct linger lg = {.l_onoff = 1, .l_linger = 0};
	setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
	close(c);

	/* 3: the peer closes with our data unread: a reset. */
	c = socket(AF_INET, SOCK_STREAM, 0);
	res("connect 3", connect(c, (struct sockaddr *)&a, sizeof a));
	writen(c, "un1", 3);
	readn(c, b, 2);
	memset(b, 'u', 100);
	writen(c, b, 100);
	struct pollfd pf = {.fd = c, .events = POLLIN};
	int n = poll(&pf, 1, 10000);
	say("poll at peer's close: %d %s", n, (pf.revents & POLLIN) ? "IN" : "-");
	res("recv at peer's reset", recv(c, b, sizeof b, 0));
	close(c);

	/* 4: the peer closes with SO_LINGER 0. */
	c = socket(AF_INET, SOCK_STREAM, 0);
	res("connect 4", connect(c, (struct sockaddr *)&a, sizeof a));
	writen(c, "lg0", 3);
	pf.fd = c;
	pf.revents = 0;
	n = poll(&pf, 1, 10000);
	say("poll at peer's abort: %d %s", n, (pf.revents & (POLLIN | POLLHUP | POLLERR)) ? "IN/HUP/ERR" : "-");
	res("recv at peer's abort", recv(c, b, sizeof b, 0));
	close(c);

	/* 5: a zero window: we read nothing for a while, then everything. */
	c = socket(AF_INET, SOCK_STREAM, 0);
	res("connect 5", connect(c, (struct sockaddr *)&a, sizeof a));
	usleep(300000);
	long total = 0;
	int good = 1;
	for (;;) {
		ssize_t r = read(c, b, sizeof b);
		if (r <= 0)
			break;
		for (ssize_t i = 0; i < r; i++)
			good &= b[i] == (char)((total + i) % 251);
		total += r;
	}
	say("zero window: read to the end, content %s, more than 64 KB %d", good ? "ok" : "WRONG", total > 65536);
	writen(c, "ok", 2);
	close(c);

	/* 6: a receive timeout set before connect holds after it. */
	c = socket(AF_INET, SOCK_STREAM, 0);
	struct timeval tv = {.tv_sec = 0, .tv_usec = 200000};
	setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	/* and the other options set before connect. */
	set_options(c, 50, 9, 5, 7000);
	setsockopt(c, IPPROTO_TCP, TCP_CONGESTION, "cubic", 5);
	struct linger lg6 = {.l_onoff = 1, .l_linger = 3};
	setsockopt(c, SOL_SOCKET, SO_LINGER, &lg6, sizeof lg6);
	res("connect 6", connect(c, (struct sockaddr *)&a, sizeof a));
	say("set before connect: %s", options(c));
	say("set before connect: %s", chosen(c));
	say("negotiated: %s", negotiated(c));
	res("recv with SO_RCVTIMEO set before connect", recv(c, b, sizeof b, 0));
	struct timeval got;
	socklen_t gl = sizeof got;
	getsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &got, &gl);
	say("SO_RCVTIMEO %ld us", (long)(got.tv_sec * 1000000 + got.tv_usec));
	close(c);

	/* 7: a non-blocking connect to a port nobody listens on. */
	c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	struct sockaddr_in z = a;
	z.sin_port = htons(closed);
	res("connect to a closed port", connect(c, (struct sockaddr *)&z, sizeof z));
	pf.fd = c;
	pf.events = POLLOUT;
	pf.revents = 0;
	n = poll(&pf, 1, 10000);
	say("poll: %d %s", n, (pf.revents & (POLLOUT | POLLERR | POLLHUP)) ? "OUT/ERR/HUP" : "-");
	int v;
	socklen_t vl = sizeof v;
	getsockopt(c, SOL_SOCKET, SO_ERROR, &v, &vl);
	say("SO_ERROR %s", v ? strerrorname_np(v) : "0");
	close(c);

	/* 8: a blocking connect to it. */
	c = socket(AF_INET, SOCK_STREAM, 0);
	res("blocking connect to a closed port", connect(c, (struct sockaddr *)&z, sizeof z));
	close(c);

	/* 9: a non-blocking connect to a host of the subnet nobody holds
	 * (.99): it returns at once, and fails once the kernel gives up on
	 * the neighbour's ARP. */
	c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	z = a;
	((unsigned char *)&z.sin_addr)[3] = 99;
	double t0 = now();
	res("connect to a host nobody holds", connect(c, (struct sockaddr *)&z, sizeof z));
	say("returned within 200 ms %d", now() - t0 < 0.2);
	pf.fd = c;
	pf.events = POLLOUT;
	pf.revents = 0;
	n = poll(&pf, 1, 10000);
	say("poll: %d %s", n, (pf.revents & (POLLOUT | POLLERR | POLLHUP)) ? "OUT/ERR/HUP" : "-");
	vl = sizeof v;
	getsockopt(c, SOL_SOCKET, SO_ERROR, &v, &vl);
	say("SO_ERROR %s", v ? strerrorname_np(v) : "0");
	close(c);
	say("client done");
	return 0;
}

int main(int argc, char **argv)
{
	start_watchdog();
	signal(SIGPIPE, on_sigpipe);
	if (argc == 3 && strcmp(argv[1], "server") == 0)
		return server(atoi(argv[2]));
	if (argc == 4 && strcmp(argv[1], "backlog") == 0)
		return backlog(atoi(argv[2]), atoi(argv[3]));
	if (argc == 3 && strcmp(argv[1], "vanish") == 0)
		return vanish(atoi(argv[2]));
	if (argc == 4 && strcmp(argv[1], "handover") == 0)
		return handover(atoi(argv[2]), argv[3]);
	if (argc == 5 && strcmp(argv[1], "client") == 0)
		return client(argv[2], atoi(argv[3]), atoi(argv[4]));
	fprintf(stderr, "usage: tcpcalls server PORT | client ADDR PORT CLOSED_PORT | backlog PORT N | vanish PORT | handover PORT FILE\n");
	return 2;
}
