/* dropuser: a daemon that gives up root, or chroots, before it opens a
 * socket, as mosquitto and many servers of ports above 1024 do.
 *
 *   dropuser setuid|setresuid|setreuid|seteuid|suid-down UID LOCAL PEER PORT
 *   dropuser chroot DIR LOCAL PEER PORT
 *
 * It calls the named function to become UID (suid-down: setresuid(-1, UID,
 * 0), which keeps root in the saved ID, as FreeRADIUS does; or it
 * chroots to DIR and makes it its working directory), prints "ok dropped",
 * then:
 *   - udp: answers one datagram on LOCAL:PORT (prints "ok udp");
 *   - tcp-server: accepts one connection on LOCAL:PORT+1, echoes one
 *     read (prints "ok tcp-server");
 *   - tcp-client: connects to PEER:PORT+2, sends "ping", reads the
 *     answer back (prints "ok tcp-client"). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "watchdog.h"

static struct sockaddr_in addr(const char *ip, int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}

static int fail(const char *what)
{
	perror(what);
	fflush(stdout);
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: dropuser setuid|setresuid|setreuid|seteuid|suid-down UID LOCAL PEER PORT | chroot DIR LOCAL PEER PORT\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	start_watchdog();
	uid_t uid = atoi(argv[2]);
	int port = atoi(argv[5]), r;
	if (!strcmp(argv[1], "chroot")) {
		if (chroot(argv[2]) < 0 || chdir("/") < 0)
			return fail("chroot");
		uid = geteuid();
		r = 0;
	} else if (!strcmp(argv[1], "seteuid"))
		r = seteuid(uid);
	else if (!strcmp(argv[1], "suid-down"))
		r = setresuid((uid_t)-1, uid, 0); /* FreeRADIUS's rad_suid_down */
	else if (!strcmp(argv[1], "setresuid"))
		r = setresuid(uid, uid, uid);
	else if (!strcmp(argv[1], "setreuid"))
		r = setreuid(uid, uid);
	else
		r = setuid(uid);
	if (r < 0 || geteuid() != uid)
		return fail(argv[1]);
	printf("ok dropped\n");

	struct sockaddr_in local = addr(argv[3], port), from;
	socklen_t fl = sizeof from;
	char buf[64];
	int u = socket(AF_INET, SOCK_DGRAM, 0);
	if (bind(u, (struct sockaddr *)&local, sizeof local) < 0)
		return fail("udp bind");
	printf("ready\n");
	ssize_t n = recvfrom(u, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
	if (n <= 0 || sendto(u, buf, n, 0, (struct sockaddr *)&from, fl) != n)
		return fail("udp");
	printf("ok udp\n");

	local.sin_port = htons(port + 1);
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(l, (struct sockaddr *)&local, sizeof local) < 0 || listen(l, 8) < 0)
		return fail("listen");
	printf("listening\n");
	int c = accept(l, NULL, NULL);
	if (c < 0 || (n = read(c, buf, sizeof buf)) <= 0 || write(c, buf, n) != n)
		return fail("tcp-server");
	close(c);
	printf("ok tcp-server\n");

	struct sockaddr_in peer = addr(argv[4], port + 2);
	c = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(c, (struct sockaddr *)&peer, sizeof peer) < 0 || write(c, "ping", 4) != 4)
		return fail("tcp-client connect");
	size_t got = 0;
	while (got < 4 && (n = read(c, buf + got, 4 - got)) > 0)
		got += n;
	if (got != 4 || memcmp(buf, "ping", 4))
		return fail("tcp-client");
	close(c);
	printf("ok tcp-client\n");
	return 0;
}
