/* stdio: a TCP client of an echo server that hands its connection to code
 * the interposer does not see, for TestRunTCPStdio:
 *
 *     stdio ADDR PORT fdopen|exec|raw
 *
 * It connects and exchanges a line with write(2) and read(2), the engine's
 * calls. Then, fdopen: the C library's stdio writes a line with fprintf and
 * reads its echo with fgets (their system calls are glibc's own). exec: it
 * execs bash, which inherits the connection and writes a line with its
 * printf builtin (stdio too) and reads its echo with its read builtin.
 * raw: it writes a line with the system call instruction itself, as a
 * program with system call wrappers of its own does (glibc's syscall(2)
 * is interposed), and closes: vmaxdp counts the line lost, and says so.
 * x86-64 only.
 * Each echo is printed as "got LINE"; an echo that does not come within
 * 5 s (SO_RCVTIMEO) ends the program with "no echo".
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>

/* raw_write is write(2) by the system call instruction. */
static long raw_write(int fd, const void *b, size_t n)
{
#if defined(__x86_64__)
	long r;
	__asm__ volatile("syscall" : "=a"(r) : "a"((long)SYS_write), "D"((long)fd), "S"(b), "d"(n) : "rcx", "r11", "memory");
	return r;
#else
	(void)fd, (void)b, (void)n;
	return -1;
#endif
}

/* must ends the program when a call fails. */
static int must(int r, const char *what)
{
	if (r < 0) {
		perror(what);
		exit(1);
	}
	return r;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: stdio ADDR PORT fdopen|exec|raw\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	int fd = must(socket(AF_INET, SOCK_STREAM, 0), "socket");
	struct timeval tv = {.tv_sec = 5};
	must(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), "setsockopt");
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
	inet_pton(AF_INET, argv[1], &sa.sin_addr);
	must(connect(fd, (struct sockaddr *)&sa, sizeof sa), "connect");
	char buf[64] = {0};
	must(write(fd, "write\n", 6), "write");
	ssize_t n = read(fd, buf, sizeof buf - 1);
	if (n <= 0) {
		printf("no echo\n");
		return 1;
	}
	buf[n] = 0;
	printf("got %s", buf);
	if (strcmp(argv[3], "raw") == 0) {
		must((int)raw_write(fd, "raw\n", 4), "raw write");
		return close(fd) < 0;
	}
	if (strcmp(argv[3], "exec") == 0) {
		char fds[16];
		snprintf(fds, sizeof fds, "%d", fd);
		execlp("bash", "bash", "-c",
		       "printf 'exec\\n' >&$0; if read -r line <&$0; then echo \"got $line\"; else echo 'no echo'; fi",
		       fds, (char *)NULL);
		perror("exec bash");
		return 1;
	}
	FILE *f = fdopen(fd, "r+");
	if (!f) {
		perror("fdopen");
		return 1;
	}
	fprintf(f, "stdio\n");
	fflush(f);
	if (!fgets(buf, sizeof buf, f)) {
		printf("no echo\n");
		return 1;
	}
	printf("got %s", buf);
	return 0;
}
