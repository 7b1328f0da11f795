/*
 * signals: an application's signals under vmaxdp run. Each check prints
 * "ok NAME" or "FAIL NAME: why"; the program exits 1 when one failed.
 *
 *   signals PORT
 *
 * It binds an offloaded UDP socket to PORT, waits for "go" (the test sends
 * it once the socket is offloaded), then:
 *  - sigwait: SIGUSR1 is blocked in every application thread and taken by
 *    a sigwait thread; signals sent to the process must all reach it
 *    (none may land on one of vmaxdp's threads, which would kill it);
 *  - recvfrom, poll, select, epoll_wait: a SIGALRM handler installed
 *    without SA_RESTART ends each blocking call with EINTR;
 *  - ppoll: a signal that the call's mask lets through ends it;
 *  - sigaction: the application reads back its own handler;
 *  - restart: after an SA_RESTART handler a blocking recvfrom goes on and
 *    returns the datagram that comes later (it prints "restart waiting"
 *    and waits for one on PORT);
 *  - preempt: Go's runtime sends no SIGURG to a thread that runs engine
 *    code, here a 300 ms poll (spinning, when the test has it spin): one
 *    that came after the call went back to the application's code would
 *    end the application's own poll or sleep with EINTR. The check puts a
 *    counting handler in place of the runtime's for the call.
 * A watchdog ends the program after 20 s.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include "watchdog.h"

static volatile sig_atomic_t alarms;
static int failed;
static int usr1;

static void on_alarm(int sig) { (void)sig; alarms++; }
static void on_usr2(int sig) { (void)sig; }
static volatile sig_atomic_t urgs;
static void on_urg(int sig) { (void)sig; urgs++; }

static void check(const char *name, int ok, const char *why)
{
	if (ok)
		printf("ok %s\n", name);
	else {
		printf("FAIL %s: %s (errno %s)\n", name, why, strerrorname_np(errno));
		failed = 1;
	}
	fflush(stdout);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *sigwaiter(void *arg)
{
	sigset_t s;
	(void)arg;
	sigemptyset(&s);
	sigaddset(&s, SIGUSR1);
	for (;;) {
		int sig;
		if (sigwait(&s, &sig) == 0)
			__atomic_add_fetch(&usr1, 1, __ATOMIC_SEQ_CST);
	}
	return NULL;
}

/* arm sends one SIGALRM to the process in 50 ms. */
static void arm(void)
{
	struct itimerval it = {.it_value = {.tv_usec = 50000}};
	setitimer(ITIMER_REAL, &it, NULL);
}

static void install(int sig, void (*h)(int), int flags)
{
	struct sigaction a = {.sa_handler = h, .sa_flags = flags};
	sigemptyset(&a.sa_mask);
	sigaction(sig, &a, NULL);
}

/* interrupted checks that call ended with EINTR after the alarm, soon. */
static void interrupted(const char *name, int r, int before, double t0)
{
	char why[128];
	double d = now() - t0;
	snprintf(why, sizeof why, "returned %d after %.3f s, %d alarm(s)", r, d, alarms - before);
	check(name, r == -1 && errno == EINTR && alarms == before + 1 && d < 2, why);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: signals PORT\n");
		return 2;
	}
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigaddset(&set, SIGALRM);
	sigaddset(&set, SIGUSR2);
	/* The helper threads block them all: the process's signals can only
	 * go to the main thread (or, wrongly, to one of vmaxdp's). */
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	pthread_t t;
	start_watchdog();
	pthread_create(&t, NULL, sigwaiter, NULL);
	sigdelset(&set, SIGUSR1);
	pthread_sigmask(SIG_UNBLOCK, &set, NULL);

	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
	if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		perror("bind");
		return 2;
	}
	char buf[64];
	/* The engine opens its stack after bind returns: the test waits for
	 * that, then sends "go", so that the checks run on an offloaded socket. */
	printf("bound\n");
	fflush(stdout);
	if (recv(fd, buf, sizeof buf, 0) != 2) {
		perror("recv go");
		return 2;
	}

	for (int i = 1; i <= 20; i++) {
		kill(getpid(), SIGUSR1);
		for (int w = 0; w < 1000 && __atomic_load_n(&usr1, __ATOMIC_SEQ_CST) < i; w++)
			usleep(1000);
	}
	char why[64];
	snprintf(why, sizeof why, "sigwait took %d of 20", usr1);
	check("sigwait", usr1 == 20, why);

	install(SIGALRM, on_alarm, 0);
	struct sigaction got;
	sigaction(SIGALRM, NULL, &got);
	check("sigaction", got.sa_handler == on_alarm && !(got.sa_flags & SA_SIGINFO), "reads back another handler");
	check("signal", signal(SIGALRM, on_alarm) == on_alarm, "returned another handler");
	install(SIGALRM, on_alarm, 0); /* signal() set SA_RESTART */

	int before = alarms;
	double t0 = now();
	arm();
	interrupted("recvfrom", (int)recvfrom(fd, buf, sizeof buf, 0, NULL, NULL), before, t0);

	struct pollfd p = {.fd = fd, .events = POLLIN};
	before = alarms, t0 = now();
	arm();
	interrupted("poll", poll(&p, 1, 5000), before, t0);

	fd_set rd;
	FD_ZERO(&rd);
	FD_SET(fd, &rd);
	struct timeval tv = {.tv_sec = 5};
	before = alarms, t0 = now();
	arm();
	interrupted("select", select(fd + 1, &rd, NULL, NULL, &tv), before, t0);

	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
	epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
	before = alarms, t0 = now();
	arm();
	interrupted("epoll_wait", epoll_wait(ep, &ev, 1, 5000), before, t0);

	/* SIGUSR2 is blocked but for the ppoll's mask; the alarm handler
	 * sends it to this thread. */
	install(SIGUSR2, on_usr2, 0);
	sigemptyset(&set);
	sigaddset(&set, SIGUSR2);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	sigset_t during;
	pthread_sigmask(SIG_BLOCK, NULL, &during);
	sigdelset(&during, SIGUSR2);
	struct timespec five = {.tv_sec = 5};
	t0 = now();
	syscall(SYS_tgkill, getpid(), gettid(), SIGUSR2); /* pending until the ppoll */
	int r = ppoll(&p, 1, &five, &during);
	snprintf(why, sizeof why, "returned %d after %.3f s", r, now() - t0);
	check("ppoll", r == -1 && errno == EINTR && now() - t0 < 2, why);

	install(SIGALRM, on_alarm, SA_RESTART);
	before = alarms;
	arm();
	printf("restart waiting\n");
	fflush(stdout);
	ssize_t n = recvfrom(fd, buf, sizeof buf, 0, NULL, NULL);
	snprintf(why, sizeof why, "returned %zd, %d alarm(s)", n, alarms - before);
	check("restart", n == 4 && alarms == before + 1, why);

	struct sigaction count = {.sa_handler = on_urg, .sa_flags = SA_RESTART | SA_ONSTACK}, runtime;
	sigemptyset(&count.sa_mask);
	sigaction(SIGURG, &count, &runtime);
	r = poll(&p, 1, 300);
	int took = urgs;
	sigaction(SIGURG, &runtime, NULL);
	snprintf(why, sizeof why, "%d SIGURG(s) during the poll, which returned %d", took, r);
	check("preempt", took == 0 && r == 0, why);
	return failed;
}
