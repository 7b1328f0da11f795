/* forkexec: an unmodified UDP application that forks and execs while it
 * holds an offloaded socket (TestRunForkExec).
 *
 *   forkexec PORT        echo one datagram on PORT; fork; the child sends
 *                        "child" from the inherited socket to the last
 *                        sender, then execs "forkexec -child PORT+1"; the
 *                        parent echoes one more datagram, then waits.
 *   forkexec -child PORT echo one datagram on PORT.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int open_port(int port)
{
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		perror("socket/bind");
		exit(2);
	}
	return fd;
}

static void echo(int fd, struct sockaddr_in *from)
{
	char buf[256];
	socklen_t len = sizeof(*from);
	ssize_t n = recvfrom(fd, buf, sizeof(buf), 0, (struct sockaddr *)from, &len);
	if (n < 0 || sendto(fd, buf, n, 0, (struct sockaddr *)from, len) != n) {
		perror("echo");
		exit(3);
	}
}

int main(int argc, char **argv)
{
	struct sockaddr_in from;
	if (argc == 3 && strcmp(argv[1], "-child") == 0) {
		int fd = open_port(atoi(argv[2]));
		printf("child ready\n");
		fflush(stdout);
		echo(fd, &from);
		return 0;
	}
	if (argc != 2)
		return 1;
	int port = atoi(argv[1]);
	int fd = open_port(port);
	printf("parent ready\n");
	fflush(stdout);
	echo(fd, &from);
	pid_t pid = fork();
	if (pid == 0) {
		if (sendto(fd, "child", 5, 0, (struct sockaddr *)&from, sizeof(from)) != 5) {
			perror("child send");
			_exit(4);
		}
		char next[16];
		snprintf(next, sizeof(next), "%d", port + 1);
		execl("/proc/self/exe", argv[0], "-child", next, (char *)NULL);
		perror("exec");
		_exit(5);
	}
	echo(fd, &from);
	int status;
	waitpid(pid, &status, 0);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 6;
}
