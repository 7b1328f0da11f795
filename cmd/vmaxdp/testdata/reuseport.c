/*
 * reuseport: a SO_REUSEPORT group served by one thread per socket, as
 * multi-threaded UDP servers (DNS servers, QUIC front ends) do.
 *
 *   reuseport PORT N SECONDS [cbpf|cbpf-late|cpu|-] [tcp]
 *
 * It opens N UDP sockets with SO_REUSEPORT, all bound to 0.0.0.0:PORT,
 * optionally choosing the group's member itself (cbpf: a classic BPF
 * program by SO_ATTACH_REUSEPORT_CBPF on the first socket; cbpf-late:
 * the same once every socket is bound, or listens; cpu:
 * SO_INCOMING_CPU on each), prints
 * "bound", and answers every datagram with "I PAYLOAD", I being the
 * index of the socket that got it. After SECONDS it prints "served I N"
 * for each socket and exits 0; a watchdog ends it after 20 s. Socket I's
 * thread is named serveI.
 *
 * With tcp, the sockets are TCP listeners (a thread per listener, as
 * threaded servers with SO_REUSEPORT run), and each request is a line
 * on a connection the thread accepted, answered with "I LINE"; N counts
 * requests. Each connection gets a thread of its own.
 */
#define _GNU_SOURCE
#include <linux/filter.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include "watchdog.h"

enum { MAX = 16 };

static int fds[MAX];
static long served[MAX];
static double until;
static int tcp;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* converse answers the lines of connection c until its end, as listener
 * i's: a thread per connection. */
static void *converse(void *arg)
{
	long i = (long)arg >> 32;
	int c = (int)(long)arg;
	char in[1500], out[1600];
	struct timeval tv = {.tv_sec = 2};
	setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	size_t have = 0;
	for (;;) {
		char *nl = memchr(in, '\n', have);
		if (!nl) {
			ssize_t n = read(c, in + have, sizeof in - 1 - have);
			if (n <= 0)
				break;
			have += n;
			continue;
		}
		*nl = 0;
		int m = snprintf(out, sizeof out, "%ld %s\n", i, in);
		if (write(c, out, m) != m)
			perror("write");
		__atomic_fetch_add(&served[i], 1, __ATOMIC_RELAXED);
		have -= nl + 1 - in;
		memmove(in, nl + 1, have);
	}
	close(c);
	return NULL;
}

static void *serve(void *arg)
{
	long i = (long)arg;
	if (tcp) {
		while (now() < until) {
			int c = accept(fds[i], NULL, NULL);
			pthread_t t;
			if (c >= 0 && pthread_create(&t, NULL, converse, (void *)(i << 32 | c)) == 0)
				pthread_detach(t);
			/* else SO_RCVTIMEO: look at the clock */
		}
		return NULL;
	}
	char in[1500], out[1600];
	while (now() < until) {
		struct sockaddr_in from;
		socklen_t alen = sizeof from;
		ssize_t n = recvfrom(fds[i], in, sizeof in - 1, 0, (struct sockaddr *)&from, &alen);
		if (n < 0)
			continue; /* SO_RCVTIMEO: look at the clock */
		in[n] = 0;
		int m = snprintf(out, sizeof out, "%ld %s", i, in);
		if (sendto(fds[i], out, m, 0, (struct sockaddr *)&from, alen) != m)
			perror("sendto");
		served[i]++;
	}
	return NULL;
}

/* attach_cbpf gives fd's group a program that chooses the member: the
 * receiving CPU modulo the group's size n. */
static int attach_cbpf(int fd, int n)
{
	struct sock_filter code[] = {
		{BPF_LD | BPF_W | BPF_ABS, 0, 0, SKF_AD_OFF + SKF_AD_CPU},
		{BPF_ALU | BPF_MOD | BPF_K, 0, 0, n},
		{BPF_RET | BPF_A, 0, 0, 0},
	};
	struct sock_fprog prog = {.len = 3, .filter = code};
	if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog) != 0) {
		perror("SO_ATTACH_REUSEPORT_CBPF");
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 4)
		return 2;
	int port = atoi(argv[1]), n = atoi(argv[2]);
	const char *selects = argc > 4 ? argv[4] : "";
	tcp = argc > 5 && !strcmp(argv[5], "tcp");
	if (n < 1 || n > MAX)
		return 2;
	start_watchdog();
	until = now() + atof(argv[3]);
	for (int i = 0; i < n; i++) {
		int one = 1;
		fds[i] = socket(AF_INET, tcp ? SOCK_STREAM : SOCK_DGRAM, 0);
		if (setsockopt(fds[i], SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) {
			perror("SO_REUSEPORT");
			return 2;
		}
		struct timeval tv = {.tv_usec = 100000};
		setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		if (!strcmp(selects, "cbpf") && i == 0) {
			if (attach_cbpf(fds[i], n) != 0)
				return 2;
		} else if (!strcmp(selects, "cpu")) {
			int cpu = i % sysconf(_SC_NPROCESSORS_ONLN);
			if (setsockopt(fds[i], SOL_SOCKET, SO_INCOMING_CPU, &cpu, sizeof cpu) != 0) {
				perror("SO_INCOMING_CPU");
				return 2;
			}
		}
		struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
		if (bind(fds[i], (struct sockaddr *)&sa, sizeof sa) != 0) {
			perror("bind");
			return 2;
		}
		if (tcp && listen(fds[i], 64) != 0) {
			perror("listen");
			return 2;
		}
	}
	if (!strcmp(selects, "cbpf-late") && attach_cbpf(fds[0], n) != 0)
		return 2;
	printf("bound\n");
	fflush(stdout);
	pthread_t t[MAX];
	for (long i = 0; i < n; i++) {
		char name[16];
		snprintf(name, sizeof name, "serve%ld", i);
		pthread_create(&t[i], NULL, serve, (void *)i);
		pthread_setname_np(t[i], name); /* the test reads each thread's context switches */
	}
	for (int i = 0; i < n; i++)
		pthread_join(t[i], NULL);
	for (int i = 0; i < n; i++)
		printf("served %d %ld\n", i, served[i]);
	return 0;
}
