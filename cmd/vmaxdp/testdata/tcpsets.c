/* tcpsets: epoll sets of TCP connections beside one another, as the
 * worker threads of memcached have them, as a transcript.
 *
 *   tcpsets server PORT             (echoes what its connections send)
 *   tcpsets client ADDR PORT UNUSED (two epoll sets, four connections)
 *
 * The client's two sets each hold connections of one stack, so that
 * under vmaxdp neither is its stack's only one: they are shared sets,
 * whose waits are the kernel's, woken by the set's bell (the engine's
 * owed.go). The transcript (what each wait returned: counts, the data of
 * the events, their masks) must be the kernel's, line for line
 * (TestRunTCPSharedSetCalls): timeouts that run out, level-triggered
 * reports until read, maxevents 1 with two ready, a kernel fd (a pipe)
 * beside owed connections, epoll_pwait2 and epoll_pwait, and a thread
 * asleep in the kernel's wait that the bell wakes. With TCPSETS_FDINFO
 * set, the client writes there how many fds the kernel watches in each
 * set (/proc/self/fdinfo): the bell is one more. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "transcript.h"
#include "watchdog.h"

#define CONNS 4

static void die(const char *what)
{
	say("FAIL %s: %s", what, strerror(errno));
	exit(1);
}

static long long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int server(int port)
{
	int l = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 8) != 0)
		die("listen");
	say("listening");
	struct pollfd p[CONNS];
	for (int i = 0; i < CONNS; i++) {
		if ((p[i].fd = accept(l, NULL, NULL)) < 0)
			die("accept");
		setsockopt(p[i].fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		p[i].events = POLLIN;
	}
	for (int open = CONNS; open > 0;) {
		if (poll(p, CONNS, -1) < 0)
			die("poll");
		for (int i = 0; i < CONNS; i++) {
			if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			char b[64];
			ssize_t n = read(p[i].fd, b, sizeof b);
			if (n <= 0) {
				close(p[i].fd);
				p[i].fd = -1;
				open--;
				continue;
			}
			if (write(p[i].fd, b, n) != n)
				die("echo");
		}
	}
	say("served");
	return 0;
}

static int c[CONNS], pipefd[2];

/* wait_print prints what a wait returned: its count, then each event's
 * data and mask, sorted by data (the kernel's order is its ready list's). */
static void wait_print(const char *what, int r, struct epoll_event *ev)
{
	if (r < 0) {
		say("%s = -1 %s", what, strerrorname_np(errno));
		return;
	}
	for (int i = 1; i < r; i++)
		for (int j = i; j > 0 && ev[j - 1].data.u64 > ev[j].data.u64; j--) {
			struct epoll_event t = ev[j];
			ev[j] = ev[j - 1];
			ev[j - 1] = t;
		}
	char line[256];
	int off = snprintf(line, sizeof line, "%s = %d", what, r);
	for (int i = 0; i < r && off < (int)sizeof line; i++)
		off += snprintf(line + off, sizeof line - off, " [%llu %#x]", (unsigned long long)ev[i].data.u64, ev[i].events);
	say("%s", line);
}

/* ready waits until the set reports data (up to 5 s): the peer's echo. */
static void ready(int ep, unsigned long long data)
{
	struct epoll_event ev[8];
	for (long long end = now_ns() + 5000000000LL; now_ns() < end;) {
		int r = epoll_wait(ep, ev, 8, 100);
		for (int i = 0; i < r; i++)
			if (ev[i].data.u64 == data)
				return;
	}
	say("FAIL no event for %llu in 5 s", data);
	exit(1);
}

static void send1(int i, char ch)
{
	if (write(c[i], &ch, 1) != 1)
		die("write");
}

static void read1(int i)
{
	char ch;
	if (read(c[i], &ch, 1) != 1)
		die("read");
}

static void *sleeper(void *arg)
{
	int ep = *(int *)arg;
	struct epoll_event ev[8];
	int r = epoll_wait(ep, ev, 8, 5000);
	wait_print("sleeping thread's wait", r, ev);
	return NULL;
}

/* watched is how many fds the kernel watches in epoll fd ep. */
static int watched(int ep)
{
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/self/fdinfo/%d", ep);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	int n = 0;
	while (fgets(line, sizeof line, f))
		n += strncmp(line, "tfd:", 4) == 0;
	fclose(f);
	return n;
}

static int client(const char *addr, int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	inet_pton(AF_INET, addr, &a.sin_addr);
	int one = 1;
	for (int i = 0; i < CONNS; i++) {
		if ((c[i] = socket(AF_INET, SOCK_STREAM, 0)) < 0 || connect(c[i], (struct sockaddr *)&a, sizeof a) != 0)
			die("connect");
		setsockopt(c[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	}
	if (pipe(pipefd) != 0)
		die("pipe");
	int ep1 = epoll_create1(EPOLL_CLOEXEC), ep2 = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event e = {.events = EPOLLIN};
	e.data.u64 = 100, epoll_ctl(ep1, EPOLL_CTL_ADD, c[0], &e);
	e.data.u64 = 101, epoll_ctl(ep1, EPOLL_CTL_ADD, c[1], &e);
	e.data.u64 = 102, epoll_ctl(ep1, EPOLL_CTL_ADD, pipefd[0], &e);
	e.data.u64 = 200, epoll_ctl(ep2, EPOLL_CTL_ADD, c[2], &e);
	e.data.u64 = 201, epoll_ctl(ep2, EPOLL_CTL_ADD, c[3], &e);
	struct epoll_event ev[8];
	int r;

	long long t0 = now_ns();
	r = epoll_wait(ep1, ev, 8, 50);
	wait_print("idle wait", r, ev);
	say("idle wait lasted its 50 ms: %s", now_ns() - t0 >= 45000000LL ? "yes" : "no");

	send1(0, 'a');
	r = epoll_wait(ep1, ev, 8, 5000);
	wait_print("echo wait", r, ev);
	r = epoll_wait(ep1, ev, 8, 0);
	wait_print("unread, again", r, ev);
	read1(0);
	r = epoll_wait(ep1, ev, 8, 20);
	wait_print("read, then", r, ev);

	send1(0, 'b');
	send1(1, 'c');
	ready(ep1, 100);
	ready(ep1, 101);
	/* Which of the two comes first is the ready list's order: the
	 * kernel's is the echoes', which may come either way. */
	int r1 = epoll_wait(ep1, ev, 1, 0);
	unsigned long long first = r1 == 1 ? ev[0].data.u64 : 0;
	if (r1 == 1)
		read1(first == 100 ? 0 : 1);
	int r2 = epoll_wait(ep1, ev, 1, 0);
	unsigned long long second = r2 == 1 ? ev[0].data.u64 : 0;
	if (r2 == 1)
		read1(second == 100 ? 0 : 1);
	say("two ready, maxevents 1: %d, then %d, both reported: %s", r1, r2,
	    first + second == 201 && first != second ? "yes" : "no");
	r = epoll_wait(ep1, ev, 1, 0);
	wait_print("none left", r, ev);

	send1(0, 'd');
	ready(ep1, 100);
	if (write(pipefd[1], "p", 1) != 1)
		die("pipe write");
	r = epoll_wait(ep1, ev, 8, 0);
	wait_print("connection and pipe", r, ev);
	read1(0);
	char p;
	if (read(pipefd[0], &p, 1) != 1)
		die("pipe read");

	send1(2, 'e');
	struct timespec ts = {.tv_sec = 5};
	r = epoll_pwait2(ep2, ev, 8, &ts, NULL);
	wait_print("epoll_pwait2", r, ev);
	read1(2);
	ts = (struct timespec){.tv_nsec = 30000000};
	t0 = now_ns();
	r = epoll_pwait2(ep2, ev, 8, &ts, NULL);
	wait_print("epoll_pwait2, 30 ms", r, ev);
	say("it lasted its 30 ms: %s", now_ns() - t0 >= 25000000LL ? "yes" : "no");

	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGUSR1);
	send1(3, 'f');
	r = epoll_pwait(ep2, ev, 8, 5000, &mask);
	wait_print("epoll_pwait", r, ev);
	read1(3);

	pthread_t t;
	pthread_create(&t, NULL, sleeper, &ep2);
	usleep(50000);
	send1(2, 'g');
	pthread_join(t, NULL);
	read1(2);

	const char *out = getenv("TCPSETS_FDINFO");
	if (out) {
		FILE *f = fopen(out, "w");
		if (f) {
			fprintf(f, "%d %d\n", watched(ep1), watched(ep2));
			fclose(f);
		}
	}
	for (int i = 0; i < CONNS; i++)
		close(c[i]);
	say("done");
	return 0;
}

int main(int argc, char **argv)
{
	start_watchdog();
	if (argc == 3 && strcmp(argv[1], "server") == 0)
		return server(atoi(argv[2]));
	if (argc == 5 && strcmp(argv[1], "client") == 0)
		return client(argv[2], atoi(argv[3]));
	fprintf(stderr, "usage: tcpsets server PORT | tcpsets client ADDR PORT UNUSED\n");
	return 2;
}
