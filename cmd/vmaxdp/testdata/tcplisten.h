/* tcplisten.h: the TCP listener of the test programs, on every address
 * with SO_REUSEADDR, as servers open theirs. */
#ifndef TCPLISTEN_H
#define TCPLISTEN_H

#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>

/* tcp_listen listens on port; -1, said with perror, when it cannot. */
static int tcp_listen(int port, int backlog)
{
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, backlog) < 0) {
		perror("listen");
		return -1;
	}
	return l;
}

#endif
