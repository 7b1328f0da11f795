/*
 * passfd: a process that binds a UDP socket and hands it to a worker,
 * which serves it: a broker that binds a port and passes it on, or a
 * master that forks its workers once its sockets are open (nsd's way).
 *
 * By default the worker is forked before the socket exists, so the
 * socket is not shared by fork but passed (SCM_RIGHTS). The parent binds,
 * waits a second (the socket is offloaded meanwhile), passes the socket
 * and keeps its own open. With FILE, the parent prints "bound" and waits
 * until FILE exists instead of a second: what is sent meanwhile waits in
 * vmaxdp's stack, for the worker. With fork too, the parent forks the
 * worker then, which inherits the socket, and never reads it itself.
 *
 * The worker prints "ready" and receives COUNT datagrams, each within
 * 5 s, then prints "got COUNT", or what it got.
 *
 *   passfd ADDR PORT COUNT [FILE [fork]]
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "watchdog.h"

static int serve(int fd, int count)
{
	struct timeval tv = {.tv_sec = 5};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	printf("ready\n");
	fflush(stdout);
	char buf[2048];
	int got = 0;
	for (; got < count; got++)
		if (recv(fd, buf, sizeof buf, 0) < 0) {
			printf("got %d, then none for 5 s\n", got);
			fflush(stdout);
			return 1;
		}
	printf("got %d\n", got);
	fflush(stdout); /* the worker ends with _exit */
	return 0;
}

/* worker receives the socket on ch, then serves it. */
static int worker(int ch, int count)
{
	char byte;
	char ctl[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {.iov_base = &byte, .iov_len = 1};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
	if (recvmsg(ch, &m, 0) != 1) {
		perror("passfd: worker: recvmsg");
		return 2;
	}
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	if (!c || c->cmsg_type != SCM_RIGHTS) {
		fprintf(stderr, "passfd: worker: no fd passed\n");
		return 2;
	}
	int fd;
	memcpy(&fd, CMSG_DATA(c), sizeof fd);
	return serve(fd, count);
}

/* pass sends fd over ch. */
static int pass(int ch, int fd)
{
	char byte = 'x';
	char ctl[CMSG_SPACE(sizeof(int))];
	memset(ctl, 0, sizeof ctl);
	struct iovec iov = {.iov_base = &byte, .iov_len = 1};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof fd);
	if (sendmsg(ch, &m, 0) != 1) {
		perror("passfd: sendmsg");
		return -1;
	}
	return 0;
}

/* await waits until path exists; the watchdog bounds the wait. */
static void await(const char *path)
{
	printf("bound\n");
	fflush(stdout);
	struct stat st;
	struct timespec tick = {.tv_nsec = 10 * 1000 * 1000};
	while (stat(path, &st) != 0)
		nanosleep(&tick, NULL);
}

int main(int argc, char **argv)
{
	int forked = argc == 6 && strcmp(argv[5], "fork") == 0;
	if (argc != 4 && argc != 5 && !forked) {
		fprintf(stderr, "usage: passfd ADDR PORT COUNT [FILE [fork]]\n");
		return 2;
	}
	start_watchdog();
	int count = atoi(argv[3]);
	int sp[2];
	pid_t pid = -1;
	if (!forked) {
		if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) != 0) {
			perror("passfd: socketpair");
			return 2;
		}
		fflush(stdout);
		if ((pid = fork()) == 0) {
			close(sp[0]);
			_exit(worker(sp[1], count));
		}
		close(sp[1]);
	}
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[2]))};
	inet_pton(AF_INET, argv[1], &a.sin_addr);
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
		perror("passfd: socket or bind");
		return 2;
	}
	if (argc >= 5)
		await(argv[4]);
	else
		sleep(1);
	if (forked) {
		fflush(stdout);
		if ((pid = fork()) == 0)
			_exit(serve(fd, count));
	} else if (pass(sp[0], fd) != 0)
		return 2;
	/* Its own copy stays open while the worker serves, as a master that
	 * hands one socket to several workers keeps it. */
	int status;
	if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
		return 2;
	close(fd);
	return WEXITSTATUS(status);
}
