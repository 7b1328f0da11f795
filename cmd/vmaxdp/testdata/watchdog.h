/* watchdog.h: the test programs' watchdog, which ends a program that hangs
 * (a test must never wait on it for ever). */
#ifndef VMXTEST_WATCHDOG_H
#define VMXTEST_WATCHDOG_H
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

static void *watchdog_run(void *arg)
{
	(void)arg;
	/* A handler that runs on this thread cuts sleep short: glibc's
	 * setuid() runs one on every thread. */
	for (unsigned left = 20; (left = sleep(left)) > 0;)
		;
	printf("FAIL watchdog: still running after 20 s\n");
	fflush(stdout);
	_exit(2);
}

/* start_watchdog ends the program with status 2 after 20 s. */
static void start_watchdog(void)
{
	pthread_t t;
	pthread_create(&t, NULL, watchdog_run, NULL);
}
#endif
