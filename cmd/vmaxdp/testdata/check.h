/* check.h: how the test programs report a check: "ok NAME", or
 * "FAIL NAME: why (errno ...)" and a failing exit status (failed). */
#ifndef VMXTEST_CHECK_H
#define VMXTEST_CHECK_H
#include <errno.h>
#include <stdio.h>
#include <string.h>

static int failed;

static void check(const char *name, int ok, const char *why)
{
	if (ok) {
		printf("ok %s\n", name);
	} else {
		printf("FAIL %s: %s (errno %s)\n", name, why, strerror(errno));
		failed = 1;
	}
	fflush(stdout);
}
#endif
