/* cancelcheck.h: the checks of the cancellation test programs (cancel.c,
 * tcpcancel.c): a check prints "ok NAME" or "FAIL NAME: why", and a thread
 * blocked in a call is cancelled and joined. */
#ifndef VMXTEST_CANCELCHECK_H
#define VMXTEST_CANCELCHECK_H
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static int failed; /* a check failed: the program exits 1 */

static void check(const char *name, int ok, const char *why)
{
	if (ok)
		printf("ok %s\n", name);
	else {
		printf("FAIL %s: %s\n", name, why);
		failed = 1;
	}
	fflush(stdout);
}

/* cancelled cancels t after it has had 100 ms to block, and says whether
 * it ended as cancelled within 2 s. */
static int cancelled(pthread_t t)
{
	usleep(100000);
	pthread_cancel(t);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 2;
	void *res = NULL;
	if (pthread_timedjoin_np(t, &res, &ts) != 0)
		return 0;
	return res == PTHREAD_CANCELED;
}
#endif
