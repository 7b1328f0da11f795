/* transcript.h: the line printer of the test programs whose output is a
 * transcript, compared line for line between a run on the kernel and one
 * under vmaxdp. */
#ifndef VMXTEST_TRANSCRIPT_H
#define VMXTEST_TRANSCRIPT_H
#include <stdarg.h>
#include <stdio.h>

/* say prints one line of the transcript, at once. */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}
#endif
