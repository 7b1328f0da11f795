/*
 * The libc socket calls of an application run under vmaxdp. Each wrapper
 * looks its fd up in a byte table, here in C: an fd the engine does not
 * serve goes straight to libc and never enters Go, which costs a call
 * across to Go (about 60 ns: BenchmarkCrossing in cmd/vmaxdp) only on the
 * fds that use the engine.
 *
 * After fork() the child never calls into Go (its Go runtime has no
 * threads): every fd there, offloaded ones included, is the kernel's, and
 * the parent hands the sockets it shares with the child back to the
 * kernel too, but those it kept (engine.Forking) and the TCP connections
 * it uses: the child's first use of one claims it (claim), and the
 * parent hands it back then (a connection moves to a kernel socket,
 * which the child gets: claim_conn). A child that execs loads a fresh
 * engine through the inherited LD_PRELOAD.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <linux/sockios.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <netinet/in.h>
#include <unistd.h>

#include "interpose.h"
#include "_cgo_export.h"

/* REAL(name) is libc's name, looked up at its first use: another
 * library's constructor may call one of our names before ours runs (knotd's
 * libcap-ng closes an fd in its own), and must reach libc then too. */
#define REAL(name) ((__typeof__(real_##name))vmx_real((void **)&real_##name, #name))
#define DECLARE(rt, name, ...) static rt (*real_##name)(__VA_ARGS__)

static void *vmx_real(void **slot, const char *name)
{
	void *f = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
	if (!f) {
		f = dlsym(RTLD_NEXT, name);
		__atomic_store_n(slot, f, __ATOMIC_RELEASE);
	}
	return f;
}

/* sys is libc's syscall(2), past this library's own (below): the raw calls
 * this file makes (an internal fd's close, a forked child's) must not come
 * back to its wrappers. */
DECLARE(long, syscall, long, ...);
DECLARE(void, _exit, int);
#define sys(...) REAL(syscall)(__VA_ARGS__)

static unsigned char vmx_state[VMX_MAXFD];
static volatile int vmx_forked;
/* The process the engine runs in: a child of clone(CLONE_VM) shares its
 * memory, and is no fork that vmx_child marks. */
static pid_t vmx_pid;
/* vmx_ready: the engine is up and what calls sigaction now is the
 * application (Go's runtime installs its own handlers before). */
static volatile int vmx_ready;

void vmx_set_state(int fd, int state)
{
	if (fd >= 0 && fd < VMX_MAXFD)
		__atomic_store_n(&vmx_state[fd], (unsigned char)state, __ATOMIC_RELEASE);
}

/* The fds vmaxdp holds for itself: the Go runtime's poller, and what the
 * engine opens (package highfd: AF_XDP sockets, BPF maps and link,
 * eventfds, the counters file). The application never opened them, so its
 * close() and closefrom() find them "not open" (EBADF, as for any number
 * it does not hold) instead of killing the runtime (fatal error:
 * netpoll failed) or cutting the engine off its queues; a dup2() onto one
 * fails with EBADF and is logged. A forked child never runs the engine: it
 * may close them. */
static unsigned char vmx_internal[VMX_MAXFD / 8];

void vmx_set_internal(int fd, int on)
{
	if (fd < 0 || fd >= VMX_MAXFD)
		return;
	unsigned char bit = (unsigned char)(1u << (fd & 7));
	if (on)
		__atomic_fetch_or(&vmx_internal[fd >> 3], bit, __ATOMIC_RELEASE);
	else
		__atomic_fetch_and(&vmx_internal[fd >> 3], (unsigned char)~bit, __ATOMIC_RELEASE);
}

static inline int internal(int fd)
{
	if ((unsigned)fd >= VMX_MAXFD || vmx_forked)
		return 0;
	return (__atomic_load_n(&vmx_internal[fd >> 3], __ATOMIC_ACQUIRE) >> (fd & 7)) & 1;
}

/* The fds that are epoll instances (epoll_create), which the engine
 * follows when one is put in another's set (EpollNest). */
static unsigned char vmx_epfd[VMX_MAXFD / 8];

static void mark_epfd(int fd, int on)
{
	if (fd < 0 || fd >= VMX_MAXFD)
		return;
	unsigned char bit = (unsigned char)(1u << (fd & 7));
	if (on)
		__atomic_fetch_or(&vmx_epfd[fd >> 3], bit, __ATOMIC_RELEASE);
	else
		__atomic_fetch_and(&vmx_epfd[fd >> 3], (unsigned char)~bit, __ATOMIC_RELEASE);
}

static inline int epfd(int fd)
{
	if ((unsigned)fd >= VMX_MAXFD || vmx_forked)
		return 0;
	return (__atomic_load_n(&vmx_epfd[fd >> 3], __ATOMIC_ACQUIRE) >> (fd & 7)) & 1;
}

static inline int state(int fd)
{
	if ((unsigned)fd >= VMX_MAXFD || vmx_forked)
		return VMX_OS;
	return __atomic_load_n(&vmx_state[fd], __ATOMIC_ACQUIRE);
}

/* engine says whether the engine serves fd's receives and multiplexing:
 * offloaded sockets, and candidates, whose offload may attach while a
 * thread waits on them. */
static inline int engine(int fd)
{
	int s = state(fd);
	return s == VMX_OFFLOADED || s == VMX_CANDIDATE;
}

/* tcp: fd is a TCP connection netstack serves (data calls to the engine,
 * multiplexing to the kernel, which mirrors its readiness). */
static inline int tcp(int fd) { return state(fd) == VMX_TCP; }

/* The page the parent's engine shares with its children of fork
 * (engine.ForkPage), set before each fork; NULL: nothing was kept. */
static struct vmx_fork_page *vmx_fork_page;

/* claim_wait: this child claimed fd's slot (it holds its pid); it wakes
 * the engine and waits for its answer (the slot back to 0): at most 1 s,
 * and not at all once the engine's process is gone. */
static void claim_wait(struct vmx_fork_page *p, int fd)
{
	__atomic_add_fetch(&p->seq, 1, __ATOMIC_SEQ_CST);
	sys(SYS_futex, &p->seq, FUTEX_WAKE, 1, NULL, NULL, 0);
	for (int i = 0; i < 100; i++) {
		int v = __atomic_load_n(&p->fd[fd], __ATOMIC_ACQUIRE);
		if (v <= 0 || (kill(p->engine_pid, 0) < 0 && errno == ESRCH))
			break;
		struct timespec ts = {.tv_nsec = 10 * 1000 * 1000};
		sys(SYS_futex, &p->fd[fd], FUTEX_WAIT, v, &ts, NULL, 0);
	}
}

/* claim_slow: this forked child uses fd, a socket the parent's engine
 * kept offloaded across the fork, where its steering takes the socket's
 * traffic. It claims the socket, and waits for the engine to hand it to
 * the kernel, which then serves both processes: at most 1 s, and not at
 * all once the engine's process is gone (its steering went with it). */
static void claim_slow(int fd)
{
	struct vmx_fork_page *p = vmx_fork_page;
	int saved = errno;
	__atomic_store_n(&vmx_state[fd], VMX_OS, __ATOMIC_RELEASE); /* the child's own table: claim once */
	int me = (int)sys(SYS_getpid), v = -1;
	if (!__atomic_compare_exchange_n(&p->fd[fd], &v, me, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST) && v <= 0) {
		errno = saved; /* not kept: the kernel's already */
		return;
	}
	claim_wait(p, fd);
	errno = saved;
}

/* orphaned: this forked child's calls on fd, a TCP connection the
 * parent's engine serves and did not hand over (claim_conn), fail with
 * ENOTCONN, said once on stderr, instead of reading the mirror's bytes. */
static void orphaned(int fd)
{
	char msg[320];
	int n = snprintf(msg, sizeof msg,
			 "vmaxdp: fd %d: this TCP connection is served by the engine of process %d, "
			 "which forked this one and could not hand it over (its log says why); a child "
			 "cannot use it (ENOTCONN): accept or connect in the child, or exec, to use TCP there\n",
			 fd, (int)getppid());
	if (n > 0)
		sys(SYS_write, 2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
	vmx_state[fd] = VMX_TCP_ORPHAN;
}

/* claim_conn: this forked child uses fd, a TCP connection the parent's
 * engine serves, of which fd names only the mirror (no data). The child
 * claims the slot and sends a channel of its own on the mirror; the
 * engine moves the connection to a kernel socket (TCP_REPAIR) and sends
 * it back on the channel (engine.claimedConn), and it takes the place of
 * every fd of the child's that names the mirror. A CGI server's child
 * that makes the connection its standard output and execs the script so
 * gets the script's answer to the peer. Children that claim together
 * each get it; one that comes once it moved (its mirror is closed) or
 * was refused is orphaned. */
static void claim_conn(int fd)
{
	struct vmx_fork_page *p = vmx_fork_page;
	int me = (int)sys(SYS_getpid), v = -1, sv[2];
	if ((!__atomic_compare_exchange_n(&p->fd[fd], &v, me, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST) && v <= 0) ||
	    sys(SYS_socketpair, AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		orphaned(fd);
		return;
	}
	char b = 0;
	struct iovec iov = {.iov_base = &b, .iov_len = 1};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	memset(&u, 0, sizeof u);
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &sv[1], sizeof(int));
	sys(SYS_sendmsg, fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL); /* failed: nothing comes back */
	sys(SYS_close, sv[1]);
	claim_wait(p, fd);
	memset(&u, 0, sizeof u);
	m.msg_controllen = sizeof u.buf;
	int kfd = -1;
	if (sys(SYS_recvmsg, sv[0], &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) == 1 && (c = CMSG_FIRSTHDR(&m)) &&
	    c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
		memcpy(&kfd, CMSG_DATA(c), sizeof(int));
	sys(SYS_close, sv[0]);
	if (kfd < 0) {
		orphaned(fd);
		return;
	}
	struct stat mirror, st;
	if (fstat(fd, &mirror) < 0)
		mirror.st_ino = 0;
	for (int f = 0; f < VMX_MAXFD; f++) {
		if (f != fd && (vmx_state[f] != VMX_TCP || fstat(f, &st) < 0 || st.st_ino != mirror.st_ino ||
				st.st_dev != mirror.st_dev))
			continue;
		long fl = sys(SYS_fcntl, f, F_GETFD, 0);
		sys(SYS_dup3, kfd, f, fl >= 0 && (fl & FD_CLOEXEC) ? O_CLOEXEC : 0);
		vmx_state[f] = VMX_OS;
	}
	sys(SYS_close, kfd);
}

/* claim: in a forked child, any use of an inherited socket the parent's
 * engine served (data, accept, waits, dup, passing it on) claims it. */
static inline void claim(int fd)
{
	if (!vmx_forked || (unsigned)fd >= VMX_MAXFD)
		return;
	int s = vmx_state[fd];
	if (__builtin_expect(s == VMX_OFFLOADED, 0) && vmx_fork_page)
		claim_slow(fd);
	else if (__builtin_expect(s == VMX_TCP, 0)) {
		int saved = errno;
		if (vmx_fork_page)
			claim_conn(fd);
		else
			orphaned(fd);
		errno = saved;
	}
}

/* claim_conn_of: a forked child's call that reads fd's state without data
 * (names, options, ioctls) claims it if it is one of the parent's TCP
 * connections, whose mirror would answer for it; another socket the
 * parent's engine served is the kernel's as it is for such a call. */
static inline void claim_conn_of(int fd)
{
	if (vmx_forked && (unsigned)fd < VMX_MAXFD && vmx_state[fd] == VMX_TCP)
		claim(fd);
}

/* orphan: in a forked child, fd names a TCP connection the parent's
 * engine serves, or another socket it served: the first use claims it
 * (claim). True, with errno ENOTCONN, for a connection not handed over. */
static int orphan(int fd)
{
	if (!vmx_forked || (unsigned)fd >= VMX_MAXFD)
		return 0;
	claim(fd);
	if (__atomic_load_n(&vmx_state[fd], __ATOMIC_ACQUIRE) != VMX_TCP_ORPHAN)
		return 0;
	errno = ENOTCONN;
	return 1;
}

/* Connections handed off at fork (engine.Handoff): netstack had completed
 * them on a listener that went back to the kernel at the fork, whose
 * backlog would have kept them for the first accept in any of the
 * processes. An accept takes one from the listener's queue before it asks
 * the kernel: through the engine in its own process (which closes its end
 * of the queue), here in a child, which closes its end once the queue is
 * empty. */
static unsigned char vmx_handoff_gone[VMX_MAXHANDOFF]; /* a child's end is closed */
static int vmx_handoff_users[VMX_MAXHANDOFF];         /* a child's takes under way */

/* handoff_recv takes one connection off the queue chan, with accept4's
 * flags; -1 if none. */
static int handoff_recv(int chan, int flags)
{
	char b;
	struct iovec iov = {.iov_base = &b, .iov_len = 1};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
	if (sys(SYS_recvmsg, chan, &m, MSG_DONTWAIT | ((flags & SOCK_CLOEXEC) ? MSG_CMSG_CLOEXEC : 0)) <= 0)
		return -1;
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof(int)))
		return -1;
	int nfd;
	memcpy(&nfd, CMSG_DATA(c), sizeof nfd);
	long fl = sys(SYS_fcntl, nfd, F_GETFL);
	if (fl >= 0)
		sys(SYS_fcntl, nfd, F_SETFL, (flags & SOCK_NONBLOCK) ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
	return nfd;
}

/* handoff_retire closes a child's end of slot i, once no take of its
 * threads uses it. */
static void handoff_retire(int i, int chan)
{
	unsigned char no = 0;
	if (!__atomic_compare_exchange_n(&vmx_handoff_gone[i], &no, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
		return;
	while (__atomic_load_n(&vmx_handoff_users[i], __ATOMIC_SEQ_CST) > 0)
		sched_yield();
	sys(SYS_close, chan);
}

/* handoff_child serves a child's accept on fd from a queue for fd's
 * listener; -1 if none waits. */
static int handoff_child(int fd, int flags)
{
	struct vmx_fork_page *p = vmx_fork_page;
	unsigned n = __atomic_load_n(&p->handoffs, __ATOMIC_ACQUIRE);
	unsigned long long ino = 0;
	for (unsigned i = 0; i < n && i < VMX_MAXHANDOFF; i++) {
		struct vmx_handoff *h = &p->handoff[i];
		if (__atomic_load_n(&vmx_handoff_gone[i], __ATOMIC_ACQUIRE))
			continue;
		__atomic_add_fetch(&vmx_handoff_users[i], 1, __ATOMIC_SEQ_CST);
		int nfd = -1, retire = 0;
		struct stat cst;
		if (__atomic_load_n(&vmx_handoff_gone[i], __ATOMIC_SEQ_CST)) {
			/* retired by another thread meanwhile */
		} else if (__atomic_load_n(&h->left, __ATOMIC_ACQUIRE) <= 0) {
			retire = !__atomic_load_n(&h->open, __ATOMIC_ACQUIRE); /* empty for good */
		} else if (sys(SYS_fstat, h->chan, &cst) < 0 || cst.st_ino != h->chan_inode) {
			/* the child closed its end: the number is not the queue's */
			__atomic_store_n(&vmx_handoff_gone[i], 1, __ATOMIC_RELEASE);
		} else {
			struct stat st;
			if (!ino && sys(SYS_fstat, fd, &st) == 0)
				ino = st.st_ino;
			if (ino == h->inode && (nfd = handoff_recv(h->chan, flags)) >= 0)
				__atomic_sub_fetch(&h->left, 1, __ATOMIC_SEQ_CST);
		}
		__atomic_sub_fetch(&vmx_handoff_users[i], 1, __ATOMIC_SEQ_CST);
		if (retire)
			handoff_retire((int)i, h->chan);
		if (nfd >= 0)
			return nfd;
	}
	return -1;
}

/* handoff serves an accept on fd, a kernel listener, with a connection
 * handed off at fork, and fills addr as accept does; -1 if none waits
 * (then the kernel's accept goes on). */
static int handoff(int fd, struct sockaddr *addr, socklen_t *alen, int flags)
{
	struct vmx_fork_page *p = vmx_fork_page;
	if (!p || !__atomic_load_n(&p->handoffs, __ATOMIC_ACQUIRE) || (flags & ~(SOCK_NONBLOCK | SOCK_CLOEXEC)))
		return -1;
	int nfd = -1, saved = errno;
	if (vmx_forked) {
		nfd = handoff_child(fd, flags);
	} else if (vmx_ready) {
		int live = 0;
		for (unsigned i = 0; i < VMX_MAXHANDOFF; i++)
			live |= __atomic_load_n(&p->handoff[i].left, __ATOMIC_ACQUIRE) > 0;
		if (live) {
			long r = vmxgo_take_handoff(fd, flags);
			nfd = r >= 0 ? (int)r : -1;
		}
	}
	if (nfd >= 0 && addr && alen)
		sys(SYS_getpeername, nfd, addr, alen);
	errno = saved;
	return nfd;
}

unsigned int vmx_knock_addr;

/* knocked: nfd, just accepted on a kernel listener, is the engine's knock
 * for a handed connection (engine.Handoff), which the caller takes
 * instead; nfd is closed. */
static int knocked(int nfd)
{
	struct vmx_fork_page *p = vmx_fork_page;
	if (!p || __atomic_load_n(&p->knocks, __ATOMIC_ACQUIRE) <= 0)
		return 0;
	struct sockaddr_in6 sa;
	socklen_t n = sizeof sa;
	int saved = errno;
	if (sys(SYS_getpeername, nfd, &sa, &n) < 0) {
		errno = saved;
		return 0;
	}
	const unsigned char *a = NULL;
	if (sa.sin6_family == AF_INET)
		a = (const unsigned char *)&((struct sockaddr_in *)&sa)->sin_addr;
	else if (sa.sin6_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&sa.sin6_addr))
		a = &sa.sin6_addr.s6_addr[12];
	if (!a || ((unsigned)a[0] << 24 | (unsigned)a[1] << 16 | (unsigned)a[2] << 8 | a[3]) != vmx_knock_addr)
		return 0;
	__atomic_sub_fetch(&p->knocks, 1, __ATOMIC_SEQ_CST);
	sys(SYS_close, nfd);
	errno = saved;
	return 1;
}

/* forget_in_child: a child's close or dup2 over fd ends what the parent's
 * table said of it. */
static inline void forget_in_child(int fd)
{
	if (vmx_forked && (unsigned)fd < VMX_MAXFD)
		vmx_state[fd] = VMX_OS;
}

/* ret turns the Go side's -errno convention into libc's. */
static inline long ret(long r)
{
	if (r < 0) {
		errno = (int)-r;
		return -1;
	}
	return r;
}


DECLARE(int, socket, int, int, int);
DECLARE(int, bind, int, const struct sockaddr *, socklen_t);
DECLARE(int, connect, int, const struct sockaddr *, socklen_t);
DECLARE(int, close, int);
DECLARE(int, pthread_cancel, pthread_t);
DECLARE(int, listen, int, int);
DECLARE(int, accept, int, struct sockaddr *, socklen_t *);
DECLARE(int, accept4, int, struct sockaddr *, socklen_t *, int);
DECLARE(int, shutdown, int, int);
DECLARE(int, getsockname, int, struct sockaddr *, socklen_t *);
DECLARE(int, getpeername, int, struct sockaddr *, socklen_t *);
DECLARE(int, getsockopt, int, int, int, void *, socklen_t *);
DECLARE(ssize_t, sendfile, int, int, off_t *, size_t);
DECLARE(ssize_t, splice, int, loff_t *, int, loff_t *, size_t, unsigned int);
DECLARE(int, dup, int);
DECLARE(int, dup2, int, int);
DECLARE(int, dup3, int, int, int);
DECLARE(int, close_range, unsigned int, unsigned int, int);
DECLARE(int, fcntl, int, int, ...);
DECLARE(int, fcntl64, int, int, ...);
DECLARE(int, ioctl, int, unsigned long, ...);
DECLARE(int, setsockopt, int, int, int, const void *, socklen_t);
DECLARE(ssize_t, recv, int, void *, size_t, int);
DECLARE(ssize_t, recvfrom, int, void *, size_t, int, struct sockaddr *, socklen_t *);
DECLARE(ssize_t, recvmsg, int, struct msghdr *, int);
DECLARE(int, recvmmsg, int, struct mmsghdr *, unsigned int, int, struct timespec *);
DECLARE(ssize_t, read, int, void *, size_t);
DECLARE(ssize_t, readv, int, const struct iovec *, int);
DECLARE(ssize_t, send, int, const void *, size_t, int);
DECLARE(ssize_t, sendto, int, const void *, size_t, int, const struct sockaddr *, socklen_t);
DECLARE(ssize_t, sendmsg, int, const struct msghdr *, int);
DECLARE(int, sendmmsg, int, struct mmsghdr *, unsigned int, int);
DECLARE(ssize_t, write, int, const void *, size_t);
DECLARE(ssize_t, writev, int, const struct iovec *, int);
DECLARE(int, poll, struct pollfd *, nfds_t, int);
DECLARE(int, ppoll, struct pollfd *, nfds_t, const struct timespec *, const sigset_t *);
DECLARE(int, select, int, fd_set *, fd_set *, fd_set *, struct timeval *);
DECLARE(int, pselect, int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *);
DECLARE(int, epoll_create, int);
DECLARE(int, epoll_create1, int);
DECLARE(int, epoll_ctl, int, int, int, struct epoll_event *);
DECLARE(int, epoll_wait, int, struct epoll_event *, int, int);
DECLARE(int, epoll_pwait, int, struct epoll_event *, int, int, const sigset_t *);
DECLARE(int, epoll_pwait2, int, struct epoll_event *, int, const struct timespec *, const sigset_t *);
DECLARE(pid_t, fork, void);
DECLARE(int, sigaction, int, const struct sigaction *, struct sigaction *);

/* The child of a fork never runs the engine: it closes the engine's fds
 * it inherited (AF_XDP sockets, the steering program's link and maps), so
 * that they go away with the parent's engine. Left open, a daemon's child
 * would keep its parent's AF_XDP socket bound and steered to after the
 * parent exits, and nobody would read it. */
static void vmx_child(void)
{
	vmx_forked = 1;
	vmx_sysmon_tid = 0; /* the parent's; a number the child's threads may get once it ends */
	struct vmx_fork_page *p = vmx_fork_page;
	unsigned n = p ? __atomic_load_n(&p->handoffs, __ATOMIC_ACQUIRE) : 0;
	for (unsigned h = 0; h < n && h < VMX_MAXHANDOFF; h++) /* the child's end of a live handoff queue stays */
		if (__atomic_load_n(&p->handoff[h].left, __ATOMIC_ACQUIRE) > 0 ||
		    __atomic_load_n(&p->handoff[h].open, __ATOMIC_ACQUIRE))
			vmx_set_internal(p->handoff[h].chan, 0);
		else
			vmx_handoff_gone[h] = 1;
	for (int i = 0; i < VMX_MAXFD / 8; i++) {
		unsigned char bits = __atomic_load_n(&vmx_internal[i], __ATOMIC_ACQUIRE);
		for (int b = 0; bits; b++, bits >>= 1)
			if (bits & 1)
				sys(SYS_close, i * 8 + b);
	}
}

/* Before a fork, the connections not used yet move to kernel sockets,
 * which the child shares (Engine.Forking). */
static void vmx_prepare(void)
{
	if (vmx_ready && !vmx_forked)
		vmx_fork_page = vmxgo_forking();
}

/* The parent of a fork shares its sockets with the child, which can use
 * them only through the kernel: the engine hands them back to it. */
static void vmx_parent(void)
{
	/* A forked child that forks again has no engine to tell. */
	if (vmx_ready && !vmx_forked)
		vmxgo_forked();
}


/* The Go runtime's threads must never take a signal meant for the
 * application: a process-directed signal goes to any thread that does not
 * block it, and one taken by a runtime thread would run the default action
 * (killing a process that waits for it with sigwait or signalfd) or the
 * application's handler away from the thread it interrupts. Go gives every
 * thread it makes the signal mask of the thread that started it (less the
 * signals the runtime needs: SIGURG, the synchronous ones and SIGCHLD), and
 * that thread is made while the library loads: so everything is blocked
 * before the runtime starts (priority 101 runs before Go's own entry in
 * .init_array) and the loading thread's own mask is restored once the
 * engine is up. glibc's pthread_sigmask leaves its internal signals
 * (SIGCANCEL, SIGSETXID) unblocked, as setuid() across threads needs. */
static sigset_t vmx_loader_mask;

/* The fds Go's runtime makes as it starts (its poller's epoll fd and
 * eventfd) would take the lowest free numbers, which are the application's
 * next ones: its first socket would not be fd 3, and a dup2 onto such a
 * number would close the runtime's poller. So every free number below
 * VMX_HELD_FDS is held (raw system calls: the libc names are ours, not yet
 * resolved) until the engine is up, and the runtime's fds land above. */
#define VMX_HELD_FDS 1024
static int vmx_held[VMX_HELD_FDS], vmx_nheld;

static void hold_low_fds(void)
{
	struct rlimit lim;
	long top = VMX_HELD_FDS;
	if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < (rlim_t)top + 64)
		top = (long)lim.rlim_cur - 64;
	long null = sys(SYS_openat, AT_FDCWD, "/dev/null", O_RDONLY | O_CLOEXEC);
	if (null < 0)
		return;
	if (null >= top) {
		sys(SYS_close, null);
		return;
	}
	vmx_held[vmx_nheld++] = (int)null;
	while (vmx_nheld < VMX_HELD_FDS) {
		long fd = sys(SYS_fcntl, null, F_DUPFD_CLOEXEC, 0);
		if (fd < 0)
			break;
		if (fd >= top) {
			sys(SYS_close, fd);
			break;
		}
		vmx_held[vmx_nheld++] = (int)fd;
	}
}

/* The engine keeps its fds at the top quarter of the fd space (package
 * highfd: at least the soft RLIMIT_NOFILE less a quarter, below 65536).
 * The first of them grows the process's fd table to that size, and the
 * kernel's expand_fdtable waits for an RCU grace period (synchronize_rcu)
 * when more than one thread shares the table: once Go's threads run, 15
 * ms of every program's start, a shell's /bin/true's too (a child of a
 * preloaded process inherits its parent's large table and never paid it).
 * Grown here, before the runtime starts a thread, it costs no wait. */
static void grow_fd_table(void)
{
	struct rlimit lim;
	if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur < 64)
		return;
	long top = lim.rlim_cur < 65536 ? (long)lim.rlim_cur : 65536;
	long null = sys(SYS_openat, AT_FDCWD, "/dev/null", O_RDONLY | O_CLOEXEC);
	if (null < 0)
		return;
	long high = sys(SYS_fcntl, null, F_DUPFD_CLOEXEC, top - top / 4);
	if (high >= 0)
		sys(SYS_close, high);
	sys(SYS_close, null);
}

static void release_low_fds(void)
{
	while (vmx_nheld > 0)
		sys(SYS_close, vmx_held[--vmx_nheld]);
}

/* open_fds marks in set the fds open now (below VMX_MAXFD), less the one
 * it reads them through. */
static void open_fds(unsigned char *set)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		char *end;
		long fd = strtol(e->d_name, &end, 10);
		if (*end == 0 && end != e->d_name && fd >= 0 && fd < VMX_MAXFD && fd != dirfd(d))
			set[fd >> 3] |= (unsigned char)(1u << (fd & 7));
	}
	closedir(d);
}

/* The fds open before the Go runtime started: any other open once the
 * engine is up is the runtime's or the engine's (internal). */
static unsigned char vmx_loader_fds[VMX_MAXFD / 8];

static void mark_runtime_fds(void)
{
	static unsigned char now[VMX_MAXFD / 8];
	open_fds(now);
	for (int i = 0; i < VMX_MAXFD / 8; i++) {
		unsigned char add = now[i] & (unsigned char)~vmx_loader_fds[i];
		if (add)
			__atomic_fetch_or(&vmx_internal[i], add, __ATOMIC_RELEASE);
	}
}

/* Go's runtime raises the soft RLIMIT_NOFILE to the hard limit as it starts
 * (go.dev/issue/46279). The application must see the limit it was given: a
 * program that uses select() may rely on its soft limit of 1024 to never
 * get an fd that overflows an fd_set. So vmxgo_init puts the loader's
 * limit back before the engine opens anything; its own fds live under it
 * (package highfd). */
static struct rlimit vmx_loader_nofile;
static int vmx_have_nofile;

__attribute__((constructor(101))) static void vmx_before_runtime(void)
{
	(void)REAL(syscall); /* resolved now: a forked child's sys() must not call dlsym */
	(void)REAL(_exit);   /* and _exit's, which a forked child calls too */
	vmx_pid = (pid_t)sys(SYS_getpid);
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &vmx_loader_mask);
	vmx_have_nofile = getrlimit(RLIMIT_NOFILE, &vmx_loader_nofile) == 0;
	open_fds(vmx_loader_fds);
	grow_fd_table();
	hold_low_fds();
}


static void vmx_install_fatal(void);

/* adopt_inherited hands the engine the sockets the process started with:
 * no call of the process's makes them. Those passed by socket activation
 * (systemd's protocol: LISTEN_PID names this process, and LISTEN_FDS
 * counts the fds from 3) are the process's own to serve; any other, a
 * parent's that a fork and exec left open, may still be served by the
 * parent. */
static void adopt_inherited(void)
{
	const char *pid = getenv("LISTEN_PID"), *n = getenv("LISTEN_FDS");
	long first = -1, end = -1;
	if (pid && n && strtol(pid, NULL, 10) == (long)vmx_pid) {
		first = 3;
		end = first + strtol(n, NULL, 10);
	}
	for (int fd = 0; fd < VMX_MAXFD; fd++) {
		struct stat st;
		if ((vmx_loader_fds[fd >> 3] & (1u << (fd & 7))) && sys(SYS_fstat, fd, &st) == 0 && S_ISSOCK(st.st_mode))
			vmx_set_state(fd, vmxgo_inherited(fd, fd >= first && fd < end));
	}
}

__attribute__((constructor)) static void vmx_init(void)
{
	pthread_atfork(vmx_prepare, vmx_parent, vmx_child);
	if (vmxgo_init(vmx_have_nofile ? &vmx_loader_nofile : NULL) != 0)
		_exit(1);
	pthread_sigmask(SIG_SETMASK, &vmx_loader_mask, NULL);
	release_low_fds();
	mark_runtime_fds();
	adopt_inherited();
	vmx_ready = 1;
	vmx_install_fatal();
}

/* The application's signal handlers run through vmx_on_signal, which counts
 * them in the interrupted thread's vmx_sig: a call the engine serves then
 * returns EINTR as the kernel's would, even while it spins in user space,
 * where no system call is there to interrupt. SA_ONSTACK is added because a
 * handler may interrupt Go code, whose goroutine stack is too small for a C
 * handler; Go gives the threads that run Go code a signal stack. SIGURG is
 * left alone: Go's runtime preempts with it. The table is written before
 * the handler is installed, so the wrapper never calls an empty slot. */
static struct sigaction vmx_app_action[_NSIG];
/* initial-exec: the library is loaded at start-up, and the engine's calls
 * read it without a call to __tls_get_addr. */
static __thread struct vmx_signals vmx_sig __attribute__((tls_model("initial-exec")));
static __thread int vmx_thread_known __attribute__((tls_model("initial-exec")));

/* Every data call into the engine (receive, send, accept, poll, select,
 * epoll_wait) comes through here: a thread's first tells the engine, which
 * gives each such thread a P of Go's (vmxgo_thread). It returns the
 * thread's signal counts, which blocking calls take. */
static void vmx_register_thread(void);

static inline struct vmx_signals *vmx_thread(void)
{
	if (__builtin_expect(!vmx_thread_known, 0)) {
		vmx_thread_known = 1;
		vmx_register_thread();
		vmxgo_thread();
	}
	return &vmx_sig;
}

/* Cancellation (pthreads(7)). The calls the engine serves are
 * cancellation points for the application, but glibc acts on a deferred
 * pthread_cancel only inside its own wrappers, and signals no thread that
 * is outside them: a thread blocked in an offloaded recvfrom was never
 * cancelled, and pthread_join waited for ever (udp-sender, at the end of
 * every transfer, cancels its return channel's thread so). Each such call
 * acts on a pending cancel as it starts (CANCEL_POINT), and
 * pthread_cancel is wrapped: after glibc's, a target waiting in the
 * engine gets its vmx_sig.cancel set, which ends the engine's spin, and
 * glibc's own SIGCANCEL, which ends its sleep (glibc's handler does
 * nothing else to a thread in deferred mode). The call then acts on the
 * cancel; with cancellation disabled it calls the engine again, as the
 * kernel's call would still wait. A thread is found by its pthread_t in
 * vmx_threads, which it joins at its first data call and leaves at exit;
 * one that came after VMX_THREADS others is not woken, as before. */
#define VMX_THREADS 4096
#define VMX_SIGCANCEL 32 /* glibc's internal SIGRTMIN, which SIGRTMIN hides */
static struct vmx_thread_slot {
	int claimed;    /* taken by a thread that is filling it in */
	pthread_t self; /* 0: not (yet) a thread's */
	struct vmx_signals *sig;
	int *waiting;
	pid_t tid;
} vmx_threads[VMX_THREADS];
static __thread int vmx_waiting __attribute__((tls_model("initial-exec")));
static pthread_key_t vmx_slot_key;
static pthread_once_t vmx_slot_once = PTHREAD_ONCE_INIT;

static void vmx_leave_threads(void *slot)
{
	struct vmx_thread_slot *t = slot;
	__atomic_store_n(&t->self, (pthread_t)0, __ATOMIC_RELEASE);
	__atomic_store_n(&t->claimed, 0, __ATOMIC_RELEASE);
}

static void vmx_slot_key_init(void) { pthread_key_create(&vmx_slot_key, vmx_leave_threads); }

static void vmx_register_thread(void)
{
	pthread_once(&vmx_slot_once, vmx_slot_key_init);
	for (int i = 0; i < VMX_THREADS; i++) {
		struct vmx_thread_slot *t = &vmx_threads[i];
		int free = 0;
		if (__atomic_load_n(&t->claimed, __ATOMIC_RELAXED) ||
		    !__atomic_compare_exchange_n(&t->claimed, &free, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
			continue;
		t->sig = &vmx_sig;
		t->waiting = &vmx_waiting;
		t->tid = (pid_t)sys(SYS_gettid);
		/* pthread_cancel reads the slot once it sees self. */
		__atomic_store_n(&t->self, pthread_self(), __ATOMIC_RELEASE);
		pthread_setspecific(vmx_slot_key, t);
		return;
	}
}

/* glibc installs its SIGCANCEL handler at the first pthread_cancel, and
 * without SA_ONSTACK: the wake below may interrupt Go code, whose
 * goroutine stack is too small for a C handler and its signal frame (see
 * vmx_on_signal). The handler is given SA_ONSTACK with a raw
 * rt_sigaction, as glibc's sigaction refuses its own signals. The wake
 * is sent only when the handler is there: the default action of an
 * unhandled SIGCANCEL ends the process. */
struct vmx_ksigaction {
	void *handler;
	unsigned long flags;
	void *restorer;
	unsigned long mask;
};
static int vmx_cancel_wakes;
static pthread_once_t vmx_cancel_once = PTHREAD_ONCE_INIT;

static void vmx_cancel_onstack(void)
{
	struct vmx_ksigaction k;
	if (sys(SYS_rt_sigaction, VMX_SIGCANCEL, NULL, &k, sizeof k.mask) != 0 || k.handler == SIG_DFL ||
	    k.handler == SIG_IGN)
		return;
	if (!(k.flags & SA_ONSTACK)) {
		k.flags |= SA_ONSTACK;
		if (sys(SYS_rt_sigaction, VMX_SIGCANCEL, &k, NULL, sizeof k.mask) != 0)
			return;
	}
	vmx_cancel_wakes = 1;
}

int pthread_cancel(pthread_t th)
{
	int r = REAL(pthread_cancel)(th);
	if (r != 0)
		return r;
	pthread_once(&vmx_cancel_once, vmx_cancel_onstack);
	/* glibc's cancel bit is set: against the target's store of
	 * vmx_waiting and its look at that bit (CANCEL_POINT). */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	for (int i = 0; i < VMX_THREADS; i++) {
		struct vmx_thread_slot *t = &vmx_threads[i];
		if (__atomic_load_n(&t->self, __ATOMIC_ACQUIRE) != th)
			continue;
		if (__atomic_load_n(t->waiting, __ATOMIC_SEQ_CST)) {
			__atomic_store_n(&t->sig->cancel, 1, __ATOMIC_SEQ_CST);
			if (vmx_cancel_wakes)
				sys(SYS_tgkill, getpid(), t->tid, VMX_SIGCANCEL);
		}
		break;
	}
	return r;
}

/* CANCEL_POINT runs call, an engine call that may wait, as a
 * cancellation point (see above), and returns what it returns.
 * CANCEL_POINT_AGAIN calls again instead when a cancel ended the wait
 * of a thread with cancellation disabled: a connect must not begin anew
 * (EALREADY) but wait for the one under way. */
#define CANCEL_POINT_AGAIN(call, again)                                                      \
	({                                                                                   \
		long r_;                                                                     \
		int again_ = 0;                                                              \
		vmx_thread(); /* found by pthread_cancel before it can wait */      \
		for (;;) {                                                                   \
			__atomic_store_n(&vmx_waiting, 1, __ATOMIC_SEQ_CST);                 \
			pthread_testcancel();                                                \
			r_ = again_ ? (again) : (call);                                      \
			__atomic_store_n(&vmx_waiting, 0, __ATOMIC_SEQ_CST);                 \
			if (!__atomic_exchange_n(&vmx_sig.cancel, 0, __ATOMIC_SEQ_CST) ||    \
			    r_ != -EINTR)                                                    \
				break;                                                       \
			again_ = 1;                                                          \
		}                                                                            \
		r_;                                                                          \
	})
#define CANCEL_POINT(call) CANCEL_POINT_AGAIN(call, call)

/* vmx_in_handler: the thread runs an application's signal handler, which
 * may have interrupted it inside the engine (see vmx_exit_flush). A
 * handler that leaves by longjmp leaves it set: the thread's _exit then
 * skips the flush, as in a handler. */
static __thread int vmx_in_handler __attribute__((tls_model("initial-exec")));

static void vmx_on_signal(int sig, siginfo_t *info, void *uc)
{
	const struct sigaction *a = &vmx_app_action[sig];
	__atomic_add_fetch(&vmx_sig.any, 1, __ATOMIC_RELAXED);
	if (!(a->sa_flags & SA_RESTART))
		__atomic_add_fetch(&vmx_sig.intr, 1, __ATOMIC_RELAXED);
	vmx_in_handler++;
	if (a->sa_flags & SA_SIGINFO)
		a->sa_sigaction(sig, info, uc);
	else
		a->sa_handler(sig);
	vmx_in_handler--;
}

/* vmx_kick_tx kicks the TX ring of each of the engine's AF_XDP sockets
 * with raw system calls, for a process that ends where the engine cannot
 * be entered (vmx_on_fatal, and an _exit from a signal handler, which may
 * have interrupted the engine holding a queue's lock): a send that
 * returned has its frame on the ring already (xsk's enqueue publishes it),
 * and only the kick is owed. In copy mode a kick sends up to 32 frames and
 * says EAGAIN while more wait, or EBUSY for a busy device: it is repeated
 * a bounded number of times. An fd is kicked only if the kernel says it is
 * an AF_XDP socket, so a number the engine let go of meanwhile is never
 * sent on. */
#define VMX_FINAL_KICKS 256
static void vmx_kick_tx(void)
{
	if (!vmx_ready || vmx_forked || (pid_t)sys(SYS_getpid) != vmx_pid)
		return;
	int saved = errno;
	for (int i = 0; i < VMX_MAXFD / 8; i++) {
		unsigned bits = __atomic_load_n(&vmx_internal[i], __ATOMIC_ACQUIRE);
		for (int b = 0; bits; b++, bits >>= 1) {
			int fd = i * 8 + b, domain = 0;
			socklen_t len = sizeof domain;
			if (!(bits & 1) || sys(SYS_getsockopt, fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 ||
			    domain != AF_XDP)
				continue;
			for (int k = 0; k < VMX_FINAL_KICKS; k++)
				if (sys(SYS_sendto, fd, NULL, 0, MSG_DONTWAIT, NULL, 0) == 0 ||
				    (errno != EAGAIN && errno != EBUSY))
					break;
		}
	}
	errno = saved;
}

/* A signal whose default action ends the process ends it without running
 * any of the process's code, and with it went what sends had left on the
 * TX rings for a coalesced kick, where the kernel would have sent it:
 * the last datagrams of a sender stopped by timeout(1), systemd or ^C.
 * So while the application leaves such a signal at SIG_DFL,
 * vmx_on_fatal is installed in its place: it kicks the rings
 * (vmx_kick_tx), puts SIG_DFL back and raises the signal again, which
 * ends the process as the default action would have, core dump and exit
 * status included. The application sees SIG_DFL (sigaction). The
 * asynchronous signals, and SIGABRT: abort(3) and a failed assert(3) end
 * a program with it, and one the engine's runtime raised only has the
 * rings kicked first (vmx_kick_tx takes no lock and enters no Go code).
 * Not a fault's signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP,
 * SIGSYS): Go's runtime takes those first, to tell its own faults from
 * the application's; nor SIGPIPE and SIGPROF, which it owns. A blocked
 * signal taken by sigwait or signalfd never runs a handler, as before. */
static int vmx_fatal(int sig)
{
	switch (sig) {
	case SIGHUP: case SIGINT: case SIGQUIT: case SIGTERM: case SIGALRM: case SIGUSR1: case SIGUSR2: case SIGABRT:
	case SIGVTALRM: case SIGXCPU: case SIGXFSZ: case SIGIO: case SIGPWR: case SIGSTKFLT:
		return 1;
	}
	return sig >= SIGRTMIN && sig <= SIGRTMAX;
}

static void vmx_on_fatal(int sig, siginfo_t *info, void *uc)
{
	(void)info;
	(void)uc;
	vmx_kick_tx();
	struct sigaction dfl = {.sa_handler = SIG_DFL};
	REAL(sigaction)(sig, &dfl, NULL);
	/* Blocked while this handler runs: delivered, to this thread, as it
	 * returns. */
	sys(SYS_tgkill, sys(SYS_getpid), sys(SYS_gettid), sig);
}

/* install_fatal puts vmx_on_fatal in SIG_DFL's place for sig; app is what
 * the application is to see. */
static int install_fatal(int sig, const struct sigaction *app, struct sigaction *old)
{
	struct sigaction w = {.sa_sigaction = vmx_on_fatal, .sa_flags = SA_SIGINFO | SA_ONSTACK};
	sigfillset(&w.sa_mask);
	struct sigaction prev = vmx_app_action[sig];
	vmx_app_action[sig] = *app;
	int r = REAL(sigaction)(sig, &w, old);
	if (r != 0)
		vmx_app_action[sig] = prev;
	return r;
}

/* At start-up, every signal vmx_fatal names that the process was given at
 * SIG_DFL. */
static void vmx_install_fatal(void)
{
	for (int sig = 1; sig < _NSIG; sig++) {
		struct sigaction cur;
		if (vmx_fatal(sig) && REAL(sigaction)(sig, NULL, &cur) == 0 && !(cur.sa_flags & SA_SIGINFO) &&
		    cur.sa_handler == SIG_DFL)
			install_fatal(sig, &cur, NULL);
	}
}

int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
	if (!vmx_ready || sig <= 0 || sig >= _NSIG || sig == SIGURG)
		return REAL(sigaction)(sig, act, old);
	struct sigaction prev = vmx_app_action[sig];
	int r;
	if (act && act->sa_handler != SIG_DFL && act->sa_handler != SIG_IGN) {
		struct sigaction w = *act;
		w.sa_sigaction = vmx_on_signal;
		w.sa_flags |= SA_SIGINFO | SA_ONSTACK;
		vmx_app_action[sig] = *act;
		r = REAL(sigaction)(sig, &w, old);
		if (r != 0)
			vmx_app_action[sig] = prev;
	} else if (act && act->sa_handler == SIG_DFL && vmx_fatal(sig)) {
		r = install_fatal(sig, act, old);
	} else {
		r = REAL(sigaction)(sig, act, old);
	}
	/* The application sees its own handler, or SIG_DFL, never the
	 * wrappers. */
	if (r == 0 && old && (old->sa_flags & SA_SIGINFO) &&
	    (old->sa_sigaction == vmx_on_signal || old->sa_sigaction == vmx_on_fatal))
		*old = prev;
	return r;
}

/* glibc's signal functions call its internal sigaction, not ours. */
static sighandler_t set_handler(int sig, sighandler_t h, int flags)
{
	struct sigaction a = {.sa_handler = h, .sa_flags = flags}, old;
	sigemptyset(&a.sa_mask);
	if (!(flags & SA_NODEFER))
		sigaddset(&a.sa_mask, sig);
	if (sigaction(sig, &a, &old) < 0)
		return SIG_ERR;
	return old.sa_handler;
}

sighandler_t signal(int sig, sighandler_t h) { return set_handler(sig, h, SA_RESTART); }
sighandler_t bsd_signal(int sig, sighandler_t h) { return set_handler(sig, h, SA_RESTART); }
sighandler_t sysv_signal(int sig, sighandler_t h) { return set_handler(sig, h, SA_RESETHAND | SA_NODEFER); }

/* A send may leave its datagram on the TX ring for a coalesced kick
 * (stack.Options.TxKickDelay); a process that ended before the kick lost
 * it, where the kernel would have sent it: a burst of 500 then _exit lost
 * 3 to 15, and exit(3)'s destructor (vmx_fini) did not kick either. The
 * flush enters the engine, so from a signal handler, which may have
 * interrupted the engine, the rings are kicked without it (vmx_kick_tx: a
 * daemon's SIGTERM handler that calls _exit). Neither is made from a
 * forked child, nor from a child of clone(CLONE_VM) (a hand-made spawn;
 * vfork is run as a fork): that is another process, which shares the
 * parent's memory while the parent's other threads run on, and its end is
 * not the engine's. */
static void vmx_exit_flush(void)
{
	if (!vmx_ready || vmx_forked || (pid_t)sys(SYS_getpid) != vmx_pid)
		return;
	if (vmx_in_handler)
		vmx_kick_tx();
	else
		vmxgo_flush();
}

void _exit(int status)
{
	vmx_exit_flush();
	REAL(_exit)(status);
	__builtin_unreachable();
}

void _Exit(int status) { _exit(status); }

/* At exit (not _exit, not a fatal signal): what sends left on the TX
 * rings leaves (vmx_exit_flush), and the engine writes VMAXDP_STATS_FILE
 * for the sockets still open and removes its stats file. A forked child
 * never ran the engine and has nothing to do. */
__attribute__((destructor)) static void vmx_fini(void)
{
	vmx_exit_flush();
	if (!vmx_forked)
		vmxgo_fini();
}

/* vmx_announced: the engine wrote its banner (vmxgo_announce), at the
 * process's first IP socket; a wrapper that makes none (a shell, env,
 * pyenv's shims) writes none. */
static atomic_int vmx_announced;

int socket(int domain, int type, int protocol)
{
	int fd = REAL(socket)(domain, type, protocol);
	if (fd < 0 || vmx_forked || (domain != AF_INET && domain != AF_INET6))
		return fd;
	if (!atomic_load_explicit(&vmx_announced, memory_order_relaxed) && !atomic_exchange(&vmx_announced, 1))
		vmxgo_announce();
	if ((type & 0xf) == SOCK_DGRAM && (protocol == 0 || protocol == IPPROTO_UDP))
		vmx_set_state(fd, vmxgo_socket(fd, (type & SOCK_NONBLOCK) != 0));
	return fd;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
	int r = REAL(bind)(fd, addr, len);
	if (r == 0 && state(fd) == VMX_CANDIDATE)
		vmx_set_state(fd, vmxgo_bind(fd));
	return r;
}

int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	int s = state(fd);
	/* A stream socket (the kernel's, or a connection of the engine's)
	 * may connect through netstack (VMAXDP_TCP=1). */
	if ((s == VMX_OS || s == VMX_TCP) && !vmx_forked && addr &&
	    ((len >= sizeof(struct sockaddr_in) && addr->sa_family == AF_INET) ||
	     (len >= sizeof(struct sockaddr_in6) && addr->sa_family == AF_INET6))) {
		long t = CANCEL_POINT_AGAIN(vmxgo_tcp_connect(fd, (struct sockaddr *)addr, len, vmx_thread()),
					    vmxgo_tcp_connect_wait(fd, vmx_thread()));
		if (t != -VMX_PASS)
			return (int)ret(t);
	}
	int r = REAL(connect)(fd, addr, len);
	s = state(fd);
	if (r == 0 && (s == VMX_CANDIDATE || s == VMX_OFFLOADED))
		vmx_set_state(fd, vmxgo_connect(fd));
	else if (s == VMX_OS && !vmx_forked && addr && addr->sa_family == AF_INET6 && (r == 0 || errno == EINPROGRESS)) {
		int e = errno;
		vmxgo_ipv6_connect(fd, (struct sockaddr *)addr, len); /* says why it stays on the kernel */
		errno = e;
	}
	return r;
}

/* listen: an AF_INET stream socket may be offloaded as it starts
 * listening (VMAXDP_TCP=1); it stays the kernel's listener as well.
 * netstack listens first: a SYN that came between the two would make a
 * kernel connection whose later segments the listener's steering takes. */
int listen(int fd, int backlog)
{
	int pre = VMX_OS;
	if (!vmx_forked && state(fd) == VMX_OS)
		pre = vmxgo_listen(fd, backlog);
	int r = REAL(listen)(fd, backlog);
	if (pre != VMX_OS) {
		if (r == 0) {
			vmx_set_state(fd, pre);
		} else {
			int e = errno;
			vmxgo_close(fd);
			errno = e;
		}
	}
	return r;
}

int accept4(int fd, struct sockaddr *addr, socklen_t *alen, int flags)
{
	claim(fd);
	if (state(fd) == VMX_OFFLOADED) {
		long r = CANCEL_POINT(vmxgo_accept(fd, addr, alen, flags, vmx_thread()));
		if (r != -VMX_PASS)
			return (int)ret(r);
	}
	for (;;) {
		int h = handoff(fd, addr, alen, flags);
		if (h >= 0)
			return h;
		int r = REAL(accept4)(fd, addr, alen, flags);
		if (r < 0 || !knocked(r))
			return r;
	}
}

int accept(int fd, struct sockaddr *addr, socklen_t *alen)
{
	claim(fd);
	if (state(fd) == VMX_OFFLOADED)
		return accept4(fd, addr, alen, 0);
	for (;;) {
		int h = handoff(fd, addr, alen, 0);
		if (h >= 0)
			return h;
		int r = REAL(accept)(fd, addr, alen);
		if (r < 0 || !knocked(r))
			return r;
	}
}

int shutdown(int fd, int how)
{
	if (orphan(fd))
		return -1;
	if (tcp(fd)) {
		long r = vmxgo_tcp_shutdown(fd, how);
		if (r != -VMX_PASS)
			return (int)ret(r);
	}
	int r = REAL(shutdown)(fd, how);
	if (r == 0 && engine(fd))
		vmxgo_shutdown(fd, how);
	return r;
}

int getsockname(int fd, struct sockaddr *addr, socklen_t *alen)
{
	claim_conn_of(fd);
	if (tcp(fd)) {
		long r = vmxgo_tcp_name(fd, 0, addr, alen);
		if (r != -VMX_PASS)
			return (int)ret(r);
	}
	return REAL(getsockname)(fd, addr, alen);
}

int getpeername(int fd, struct sockaddr *addr, socklen_t *alen)
{
	if (orphan(fd))
		return -1;
	if (tcp(fd)) {
		long r = vmxgo_tcp_name(fd, 1, addr, alen);
		if (r != -VMX_PASS)
			return (int)ret(r);
	}
	return REAL(getpeername)(fd, addr, alen);
}

int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	claim_conn_of(fd);
	if (tcp(fd)) {
		long r = vmxgo_tcp_getsockopt(fd, level, name, val, len);
		if (r != -VMX_PASS)
			return (int)ret(r);
	}
	if (level == SOL_SOCKET && name == SO_RCVBUF && engine(fd) && val && len && *len >= sizeof(int)) {
		/* While its stack opens, the kernel socket's buffer is raised
		 * (engine.holdKernelQueue): the application sees its own. */
		int held = vmxgo_held_rcvbuf(fd);
		if (held > 0) {
			*(int *)val = held;
			*len = sizeof(int);
			return 0;
		}
	}
	return REAL(getsockopt)(fd, level, name, val, len);
}

/* forget: fd is closed; the engine forgets what it knew of it. */
static void forget(int fd)
{
	int ep = epfd(fd);
	if (ep)
		mark_epfd(fd, 0);
	if (state(fd) != VMX_OS || ep) {
		vmx_set_state(fd, VMX_OS);
		vmxgo_close(fd);
	}
}

int close(int fd)
{
	if (internal(fd)) {
		errno = EBADF;
		return -1;
	}
	forget_in_child(fd);
	forget(fd);
	return REAL(close)(fd);
}

/* to_stdio: fd, when a TCP connection netstack serves, is to be read and
 * written by stdio, whose system calls do not come here (a standard
 * stream, fdopen): the engine moves it to a kernel socket (stdio.go). */
static void to_stdio(int fd, int stdio)
{
	if (stdio && vmx_ready && !vmx_forked && tcp(fd))
		vmxgo_to_stdio(fd);
}

/* after_dup: newfd now names oldfd's socket or epoll instance; whatever
 * newfd named before (dup2 closes it) is forgotten by the engine's Dup. */
static int after_dup(int oldfd, int newfd)
{
	if (newfd < 0)
		return newfd;
	if (epfd(newfd))
		forget(newfd);
	int ep = epfd(oldfd);
	if (ep)
		mark_epfd(newfd, 1);
	if (state(oldfd) != VMX_OS || state(newfd) != VMX_OS || ep)
		vmx_set_state(newfd, vmxgo_dup(oldfd, newfd));
	to_stdio(newfd, newfd <= 2);
	return newfd;
}

DECLARE(FILE *, fdopen, int, const char *);

FILE *fdopen(int fd, const char *mode)
{
	to_stdio(fd, 1);
	return REAL(fdopen)(fd, mode);
}

int dup(int fd)
{
	claim(fd); /* the copy may outlive an exec */
	return after_dup(fd, REAL(dup)(fd));
}

/* refused: dup2/dup3 onto one of vmaxdp's own fds (see vmx_internal). */
static int refused(int newfd, const char *call)
{
	vmxgo_refused(newfd, (char *)call);
	errno = EBADF;
	return -1;
}

int dup2(int oldfd, int newfd)
{
	if (oldfd == newfd)
		return REAL(dup2)(oldfd, newfd);
	claim(oldfd);
	forget_in_child(newfd);
	if (internal(newfd))
		return refused(newfd, "dup2");
	return after_dup(oldfd, REAL(dup2)(oldfd, newfd));
}

int dup3(int oldfd, int newfd, int flags)
{
	if (oldfd != newfd && internal(newfd))
		return refused(newfd, "dup3");
	claim(oldfd);
	forget_in_child(newfd);
	return after_dup(oldfd, REAL(dup3)(oldfd, newfd, flags));
}

static int sys_close_range(unsigned int first, unsigned int last, int flags)
{
	if (REAL(close_range))
		return REAL(close_range)(first, last, flags);
	return (int)sys(SYS_close_range, first, last, flags);
}

/* close_range closes the range around vmaxdp's own fds, and tells the
 * engine of each socket it closes, as close() does. */
int close_range(unsigned int first, unsigned int last, int flags)
{
	if (vmx_forked && !(flags & CLOSE_RANGE_CLOEXEC))
		for (unsigned int fd = first; fd <= last && fd < VMX_MAXFD; fd++)
			forget_in_child((int)fd);
	if ((flags & CLOSE_RANGE_CLOEXEC) || first > last || vmx_forked)
		return sys_close_range(first, last, flags);
	unsigned int lo = first;
	for (unsigned int fd = first; fd <= last && fd < VMX_MAXFD; fd++) {
		if (internal((int)fd)) {
			if (fd > lo && sys_close_range(lo, fd - 1, flags) != 0)
				return -1;
			lo = fd + 1;
		} else
			forget((int)fd);
	}
	if (lo <= last)
		return sys_close_range(lo, last, flags);
	return 0;
}

void closefrom(int lowfd)
{
	if (lowfd < 0)
		lowfd = 0;
	if (close_range((unsigned int)lowfd, ~0U, 0) == 0)
		return;
	/* close_range is missing (before Linux 5.9): one close() per fd. */
	struct rlimit lim;
	long top = VMX_MAXFD;
	if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < (rlim_t)top)
		top = (long)lim.rlim_cur;
	for (long fd = lowfd; fd < top; fd++)
		close((int)fd);
}

static int do_fcntl(int (*f)(int, int, ...), int fd, int cmd, long arg)
{
	/* A copy, or the fd itself once it is no longer close-on-exec, may
	 * outlive an exec. */
	if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC || (cmd == F_SETFD && !(arg & FD_CLOEXEC)))
		claim(fd);
	int r = f(fd, cmd, arg);
	if (r < 0 || state(fd) == VMX_OS)
		return r;
	if (cmd == F_SETFL)
		vmxgo_set_nonblock(fd, (arg & O_NONBLOCK) != 0);
	else if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)
		after_dup(fd, r);
	return r;
}

int fcntl(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	long arg = va_arg(ap, long);
	va_end(ap);
	return do_fcntl(REAL(fcntl), fd, cmd, arg);
}

int fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	long arg = va_arg(ap, long);
	va_end(ap);
	return do_fcntl(REAL(fcntl64) ? REAL(fcntl64) : REAL(fcntl), fd, cmd, arg);
}

int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	claim_conn_of(fd);
	int s = state(fd);
	if (s == VMX_TCP && (req == FIONREAD || req == TIOCOUTQ) && arg) {
		long r = vmxgo_tcp_queued(fd, req == TIOCOUTQ);
		if (r != -VMX_PASS) {
			if (r < 0)
				return (int)ret(r);
			*(int *)arg = (int)r;
			return 0;
		}
	}
	if (s == VMX_OFFLOADED && req == FIONREAD && arg) {
		long r = vmxgo_fionread(fd);
		if (r != -VMX_PASS) {
			*(int *)arg = (int)r;
			return 0;
		}
	}
	/* The last datagram's arrival: the kernel socket read none of them.
	 * Old and new layouts are both two 64-bit fields on this ABI. */
	if (s == VMX_OFFLOADED && arg &&
	    (req == SIOCGSTAMP_OLD || req == SIOCGSTAMPNS_OLD || req == SIOCGSTAMP_NEW || req == SIOCGSTAMPNS_NEW)) {
		long long ns;
		long r = vmxgo_gettstamp(fd, &ns);
		if (r != -VMX_PASS) {
			if (r < 0)
				return (int)ret(r);
			int nano = req == SIOCGSTAMPNS_OLD || req == SIOCGSTAMPNS_NEW;
			long long *v = arg;
			v[0] = ns / 1000000000LL;
			v[1] = nano ? ns % 1000000000LL : ns % 1000000000LL / 1000;
			return 0;
		}
	}
	int r = REAL(ioctl)(fd, req, arg);
	if (r == 0 && s != VMX_OS && req == FIONBIO && arg)
		vmxgo_set_nonblock(fd, *(int *)arg != 0);
	return r;
}

int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	claim_conn_of(fd);
	int s = state(fd);
	if (s == VMX_OS) {
		int r = REAL(setsockopt)(fd, level, name, val, len);
		/* A stream socket's choice of its SO_REUSEPORT group's member,
		 * which its listen reads. */
		if (r == 0 && !vmx_forked && level == SOL_SOCKET &&
		    (name == SO_ATTACH_REUSEPORT_CBPF || name == SO_ATTACH_REUSEPORT_EBPF || name == SO_INCOMING_CPU))
			vmxgo_setsockopt(fd, level, name, (void *)val, len);
		return r;
	}
	if (s == VMX_TCP) {
		long r = vmxgo_tcp_setsockopt(fd, level, name, (void *)val, len);
		if (r != -VMX_PASS)
			return (int)ret(r);
		int kr = REAL(setsockopt)(fd, level, name, val, len);
		/* A listener bound to another interface than its stack's goes
		 * back to the kernel, once the kernel took the device. */
		if (kr == 0 && level == SOL_SOCKET && (name == SO_BINDTODEVICE || name == SO_BINDTOIFINDEX))
			vmxgo_setsockopt(fd, level, name, (void *)val, len);
		return kr;
	}
	if (level == IPPROTO_IP && (name == IP_ADD_MEMBERSHIP || name == IP_DROP_MEMBERSHIP) &&
	    val && len >= sizeof(struct ip_mreq)) {
		const struct ip_mreqn *m = val;
		int ifindex = len >= sizeof(struct ip_mreqn) ? m->imr_ifindex : 0;
		long r = vmxgo_membership(fd, name == IP_ADD_MEMBERSHIP, m->imr_multiaddr.s_addr,
					  m->imr_address.s_addr, ifindex);
		if (r != -VMX_PASS)
			return (int)ret(r);
	}
	int r = REAL(setsockopt)(fd, level, name, val, len);
	if (r == 0)
		vmxgo_setsockopt(fd, level, name, (void *)val, len);
	return r;
}

/* TCP data calls: through iovecs, to the engine. A send that finds the
 * connection closed raises SIGPIPE, as the kernel's does, unless
 * MSG_NOSIGNAL. */
static long tcp_recv(int fd, const struct iovec *iov, int n, int flags)
{
	return CANCEL_POINT(vmxgo_tcp_recv(fd, (struct iovec *)iov, n, flags, vmx_thread()));
}

static long tcp_send(int fd, const struct iovec *iov, int n, int flags)
{
	long r = CANCEL_POINT(vmxgo_tcp_send(fd, (struct iovec *)iov, n, flags, vmx_thread()));
	if (r == -EPIPE && !(flags & MSG_NOSIGNAL))
		raise(SIGPIPE);
	return r;
}

ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *src, socklen_t *alen)
{
	if (orphan(fd))
		return -1;
	if (tcp(fd)) {
		struct iovec v = {.iov_base = buf, .iov_len = len};
		long r = tcp_recv(fd, &v, 1, flags);
		if (r != -VMX_PASS) {
			if (r >= 0 && src && alen)
				*alen = 0; /* a connected stream names no sender */
			return ret(r);
		}
	}
	if (engine(fd)) {
		long r = CANCEL_POINT(vmxgo_recvfrom(fd, buf, len, flags, src, alen, vmx_thread()));
		if (r != -VMX_PASS)
			return ret(r);
	}
	return REAL(recvfrom)(fd, buf, len, flags, src, alen);
}

ssize_t recv(int fd, void *buf, size_t len, int flags)
{
	if (engine(fd) || tcp(fd) || orphan(fd))
		return recvfrom(fd, buf, len, flags, NULL, NULL);
	return REAL(recv)(fd, buf, len, flags);
}

ssize_t read(int fd, void *buf, size_t len)
{
	if (engine(fd) || tcp(fd) || orphan(fd))
		return recvfrom(fd, buf, len, 0, NULL, NULL);
	return REAL(read)(fd, buf, len);
}

ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	if (orphan(fd))
		return -1;
	if (tcp(fd)) {
		long r = tcp_recv(fd, msg->msg_iov, (int)msg->msg_iovlen, flags);
		if (r != -VMX_PASS) {
			if (r >= 0) {
				msg->msg_namelen = 0;
				msg->msg_controllen = 0;
				msg->msg_flags = 0;
			}
			return ret(r);
		}
	}
	if (engine(fd)) {
		long r = CANCEL_POINT(vmxgo_recvmsg(fd, msg, flags, vmx_thread()));
		if (r != -VMX_PASS)
			return ret(r);
	}
	return REAL(recvmsg)(fd, msg, flags);
}

ssize_t readv(int fd, const struct iovec *iov, int n)
{
	if (engine(fd) || tcp(fd) || orphan(fd)) {
		struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = n};
		return recvmsg(fd, &m, 0);
	}
	return REAL(readv)(fd, iov, n);
}

int recvmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags, struct timespec *timeout)
{
	if ((tcp(fd) || orphan(fd)) && n > 0) {
		/* A stream's messages are its reads: one, as much as it has. */
		ssize_t r = recvmsg(fd, &v[0].msg_hdr, flags & ~MSG_WAITFORONE);
		if (r < 0)
			return -1;
		v[0].msg_len = (unsigned int)r;
		return 1;
	}
	if (engine(fd)) {
		long r = CANCEL_POINT(vmxgo_recvmmsg(fd, v, n, flags, timeout, vmx_thread()));
		if (r != -VMX_PASS)
			return (int)ret(r);
	}
	return REAL(recvmmsg)(fd, v, n, flags, timeout);
}

/* The __*_chk variants are what _FORTIFY_SOURCE builds call. */
ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags, struct sockaddr *src, socklen_t *alen)
{
	if (len > buflen)
		abort();
	return recvfrom(fd, buf, len, flags, src, alen);
}

ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags)
{
	if (len > buflen)
		abort();
	return recv(fd, buf, len, flags);
}

ssize_t __read_chk(int fd, void *buf, size_t len, size_t buflen)
{
	if (len > buflen)
		abort();
	return read(fd, buf, len);
}

/* sent_os counts what the kernel socket of an offloaded fd sent when the
 * engine passed it a send (a flag, a cork or a source it does not serve),
 * or of a candidate whose stack is opening: the socket's tx_os counters,
 * as the stack counts the sends it hands the kernel socket itself. */
static void sent_os(int fd, long packets, long bytes)
{
	int s = state(fd);
	if (packets > 0 && (s == VMX_OFFLOADED || s == VMX_CANDIDATE))
		vmxgo_sent_os(fd, packets, bytes);
}

ssize_t sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *to, socklen_t alen)
{
	if (orphan(fd))
		return -1;
	int s = state(fd);
	if (s == VMX_TCP) {
		/* A connected stream ignores the address, as the kernel's does. */
		struct iovec v = {.iov_base = (void *)buf, .iov_len = len};
		long r = tcp_send(fd, &v, 1, flags);
		if (r != -VMX_PASS)
			return ret(r);
	}
	if (s == VMX_OFFLOADED || s == VMX_CANDIDATE) {
		vmx_thread();
		long r = vmxgo_sendto(fd, (void *)buf, len, flags, (struct sockaddr *)to, alen);
		if (r != -VMX_PASS)
			return ret(r);
		ssize_t n = REAL(sendto)(fd, buf, len, flags, to, alen);
		if (n >= 0)
			sent_os(fd, 1, n);
		return n;
	}
	return REAL(sendto)(fd, buf, len, flags, to, alen);
}

/* send, write and writev on a candidate go through sendto as well: the
 * first send decides its offload (iperf3's server answers with write). */
ssize_t send(int fd, const void *buf, size_t len, int flags)
{
	int s = state(fd);
	if (s == VMX_OFFLOADED || s == VMX_CANDIDATE || s == VMX_TCP || orphan(fd))
		return sendto(fd, buf, len, flags, NULL, 0);
	return REAL(send)(fd, buf, len, flags);
}

ssize_t write(int fd, const void *buf, size_t len)
{
	int s = state(fd);
	if (s == VMX_OFFLOADED || s == VMX_CANDIDATE || s == VMX_TCP || orphan(fd))
		return sendto(fd, buf, len, 0, NULL, 0);
	return REAL(write)(fd, buf, len);
}

/* claim_passed: fds passed to another process (SCM_RIGHTS), which reaches
 * them in the kernel: the engine's process hands those it serves to the
 * kernel (vmxgo_passed), and a forked child claims them, as that process
 * may use them. */
static void claim_passed(const struct msghdr *msg)
{
	if (!vmx_ready || !msg || !msg->msg_control || (vmx_forked && !vmx_fork_page))
		return;
	/* Bounded by the buffer, whatever cmsg_len says: the kernel checks
	 * it after us. */
	const unsigned char *end = (const unsigned char *)msg->msg_control + msg->msg_controllen;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c && c->cmsg_len >= CMSG_LEN(0); c = CMSG_NXTHDR((struct msghdr *)msg, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
			for (const unsigned char *d = CMSG_DATA(c);
			     d + sizeof(int) <= (const unsigned char *)c + c->cmsg_len && d + sizeof(int) <= end; d += sizeof(int)) {
				int passed;
				memcpy(&passed, d, sizeof passed);
				if (vmx_forked)
					claim(passed);
				else if (state(passed) != VMX_OS)
					vmxgo_passed(passed);
			}
}

ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	claim_passed(msg);
	if (orphan(fd))
		return -1;
	int s = state(fd);
	if (s == VMX_TCP) {
		long r = tcp_send(fd, msg->msg_iov, (int)msg->msg_iovlen, flags);
		if (r != -VMX_PASS)
			return ret(r);
	}
	if (s == VMX_OFFLOADED || s == VMX_CANDIDATE) {
		vmx_thread();
		long r = vmxgo_sendmsg(fd, (struct msghdr *)msg, flags);
		if (r != -VMX_PASS)
			return ret(r);
		ssize_t n = REAL(sendmsg)(fd, msg, flags);
		if (n >= 0)
			sent_os(fd, 1, n);
		return n;
	}
	return REAL(sendmsg)(fd, msg, flags);
}

ssize_t writev(int fd, const struct iovec *iov, int n)
{
	int s = state(fd);
	if (s == VMX_OFFLOADED || s == VMX_CANDIDATE || s == VMX_TCP || orphan(fd)) {
		struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = n};
		return sendmsg(fd, &m, 0);
	}
	return REAL(writev)(fd, iov, n);
}

int sendmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags)
{
	int s = state(fd);
	if (s == VMX_TCP || orphan(fd)) {
		unsigned int i;
		for (i = 0; i < n; i++) {
			ssize_t r = sendmsg(fd, &v[i].msg_hdr, flags);
			if (r < 0)
				return i ? (int)i : -1;
			v[i].msg_len = (unsigned int)r;
		}
		return (int)i;
	}
	if (s != VMX_OFFLOADED && s != VMX_CANDIDATE)
		return REAL(sendmmsg)(fd, v, n, flags);
	unsigned int i;
	vmx_thread();
	for (i = 0; i < n; i++) {
		long r = vmxgo_sendmsg(fd, &v[i].msg_hdr, flags);
		if (r == -VMX_PASS && i == 0) {
			int k = REAL(sendmmsg)(fd, v, n, flags);
			long bytes = 0;
			for (int j = 0; j < k; j++)
				bytes += v[j].msg_len;
			sent_os(fd, k, bytes);
			return k;
		}
		if (r == -VMX_PASS)
			return (int)i;
		if (r < 0)
			return i ? (int)i : (int)ret(r);
		v[i].msg_len = (unsigned int)r;
	}
	return (int)i;
}

/* sendfile onto an offloaded TCP connection: read from in_fd, write
 * through the engine (the kernel's sendfile would write to the mirror). */
static ssize_t tcp_sendfile(int out, int in, off_t *off, size_t count)
{
	char buf[16384];
	size_t done = 0;
	while (done < count) {
		size_t want = count - done < sizeof buf ? count - done : sizeof buf;
		ssize_t n = off ? pread(in, buf, want, *off) : REAL(read)(in, buf, want);
		if (n < 0)
			return done ? (ssize_t)done : -1;
		if (n == 0)
			break;
		ssize_t w = write(out, buf, (size_t)n);
		if (w < 0)
			return done ? (ssize_t)done : -1;
		if (off)
			*off += w;
		else if (w < n)
			lseek(in, w - n, SEEK_CUR); /* put back what was not sent */
		done += (size_t)w;
		if (w < n)
			break;
	}
	return (ssize_t)done;
}

ssize_t sendfile(int out, int in, off_t *off, size_t count)
{
	if (tcp(out) || orphan(out))
		return orphan(out) ? -1 : tcp_sendfile(out, in, off, count);
	return REAL(sendfile)(out, in, off, count);
}

ssize_t sendfile64(int out, int in, off_t *off, size_t count) { return sendfile(out, in, off, count); }

/* splice onto or from an offloaded TCP connection goes through the engine
 * (the kernel's would move the bytes to or from the mirror). A socket
 * and a pipe take no offset: ESPIPE, as on the kernel. */
ssize_t splice(int in, loff_t *off_in, int out, loff_t *off_out, size_t len, unsigned int flags)
{
	if (orphan(in) || orphan(out))
		return -1;
	if (tcp(in) || tcp(out)) {
		if (off_in || off_out) {
			errno = ESPIPE;
			return -1;
		}
		long r = CANCEL_POINT(vmxgo_tcp_splice(in, out, len, flags, vmx_thread()));
		if (r == -EPIPE)
			raise(SIGPIPE);
		if (r != -VMX_PASS)
			return (ssize_t)ret(r);
	}
	return REAL(splice)(in, off_in, out, off_out, len, flags);
}

/* Multiplexers: the engine serves them only when an fd in the set is one
 * of its sockets, or an epoll fd whose set it serves. timeout_ns < 0
 * waits for ever. */
static int any_engine_fd(const struct pollfd *fds, nfds_t n)
{
	if (vmx_forked) {
		for (nfds_t i = 0; i < n; i++)
			claim(fds[i].fd);
		return 0;
	}
	for (nfds_t i = 0; i < n; i++)
		if (engine(fds[i].fd) || state(fds[i].fd) == VMX_EPOLL)
			return 1;
	return 0;
}

int vmx_tcp_owed;

/* pay_owed: the kernel is about to look at fds that may be TCP
 * connections' mirrors. */
static inline void pay_owed(void)
{
	if (__builtin_expect(__atomic_load_n(&vmx_tcp_owed, __ATOMIC_ACQUIRE) != 0, 0) && !vmx_forked)
		vmxgo_tcp_pay();
}

int poll(struct pollfd *fds, nfds_t n, int timeout)
{
	pay_owed();
	if (!any_engine_fd(fds, n))
		return REAL(poll)(fds, n, timeout);
	return (int)ret(CANCEL_POINT(vmxgo_poll(VMX_MUX_POLL, fds, n, timeout < 0 ? -1 : (long long)timeout * 1000000, NULL, vmx_thread())));
}

/* ts_ns: a wait's timeout in nanoseconds, -1 for none. One too long to
 * count in 64 bits is none: the kernel's would outlast the process. */
static long long ts_ns(const struct timespec *ts)
{
	if (!ts || ts->tv_sec >= LLONG_MAX / 1000000000LL)
		return -1;
	return ts->tv_sec * 1000000000LL + ts->tv_nsec;
}

/* bad_ts: a timeout the kernel refuses with EINVAL. */
static int bad_ts(const struct timespec *ts)
{
	return ts && (ts->tv_sec < 0 || ts->tv_nsec < 0 || ts->tv_nsec >= 1000000000L);
}

static long long mono_ns(void)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return now.tv_sec * 1000000000LL + now.tv_nsec;
}

/* time_left: what remains of a wait of timeout_ns begun at start_ns,
 * which Linux writes back into select's timeval and the raw ppoll and
 * pselect6's timespec (glibc's ppoll and pselect hide it, its select
 * does not). Programs that loop on select with one timeval count on it
 * for their deadline. */
static struct timespec time_left(long long timeout_ns, long long start_ns)
{
	long long left = timeout_ns - (mono_ns() - start_ns);
	if (left < 0)
		left = 0;
	return (struct timespec){.tv_sec = left / 1000000000LL, .tv_nsec = left % 1000000000LL};
}

int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *ts, const sigset_t *mask)
{
	pay_owed();
	if (!any_engine_fd(fds, n))
		return REAL(ppoll)(fds, n, ts, mask);
	if (bad_ts(ts)) {
		errno = EINVAL;
		return -1;
	}
	return (int)ret(CANCEL_POINT(vmxgo_poll(VMX_MUX_POLL, fds, n, ts_ns(ts), (void *)mask, vmx_thread())));
}

/* What _FORTIFY_SOURCE builds call when nfds is not a constant (Debian
 * builds its packages so: memcached, nsd): glibc's would go to the kernel
 * without passing through poll and ppoll above. */
extern void __chk_fail(void) __attribute__((noreturn));

int __poll_chk(struct pollfd *fds, nfds_t n, int timeout, size_t fdslen)
{
	if (fdslen / sizeof *fds < n)
		__chk_fail();
	return poll(fds, n, timeout);
}

int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *ts, const sigset_t *mask, size_t fdslen)
{
	if (fdslen / sizeof *fds < n)
		__chk_fail();
	return ppoll(fds, n, ts, mask);
}

/* select and pselect go through poll when an engine socket is in a set. */
static int select_engine(int nfds, fd_set *r, fd_set *w, fd_set *x, long long timeout_ns, const sigset_t *mask)
{
	struct pollfd stackbuf[64], *p = stackbuf;
	int n = 0, any = 0;
	for (int fd = 0; fd < nfds; fd++)
		if ((r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) || (x && FD_ISSET(fd, x)))
			n++;
	if (n > 64 && !(p = malloc(n * sizeof(*p)))) {
		errno = ENOMEM;
		return -1;
	}
	n = 0;
	for (int fd = 0; fd < nfds; fd++) {
		short ev = 0;
		if (r && FD_ISSET(fd, r)) ev |= POLLIN;
		if (w && FD_ISSET(fd, w)) ev |= POLLOUT;
		if (x && FD_ISSET(fd, x)) ev |= POLLPRI;
		if (ev) {
			p[n].fd = fd, p[n].events = ev, p[n].revents = 0;
			any |= engine(fd) || state(fd) == VMX_EPOLL;
			n++;
		}
	}
	int res;
	if (!any) {
		res = -2; /* not ours */
		goto out;
	}
	res = (int)ret(CANCEL_POINT(vmxgo_poll(VMX_MUX_SELECT, p, n, timeout_ns, (void *)mask, vmx_thread())));
	if (res < 0)
		goto out;
	if (r) FD_ZERO(r);
	if (w) FD_ZERO(w);
	if (x) FD_ZERO(x);
	res = 0;
	for (int i = 0; i < n; i++) {
		short rv = p[i].revents;
		if (rv & POLLNVAL) {
			errno = EBADF;
			res = -1;
			goto out;
		}
		if (r && (rv & (POLLIN | POLLHUP | POLLERR)) && (p[i].events & POLLIN)) FD_SET(p[i].fd, r), res++;
		if (w && (rv & (POLLOUT | POLLERR)) && (p[i].events & POLLOUT)) FD_SET(p[i].fd, w), res++;
		if (x && (rv & POLLPRI)) FD_SET(p[i].fd, x), res++;
	}
out:
	if (p != stackbuf)
		free(p);
	return res;
}

/* claim_set: a forked child's select claims what it waits on. */
static void claim_set(int nfds, fd_set *r, fd_set *w, fd_set *x)
{
	for (int fd = 0; fd < nfds && fd < FD_SETSIZE; fd++)
		if ((r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) || (x && FD_ISSET(fd, x)))
			claim(fd);
}

int select(int nfds, fd_set *r, fd_set *w, fd_set *x, struct timeval *tv)
{
	pay_owed();
	if (vmx_forked)
		claim_set(nfds, r, w, x);
	else if (tv && (tv->tv_sec < 0 || tv->tv_usec < 0)) {
		errno = EINVAL;
		return -1;
	} else {
		/* glibc carries microseconds past a second into the seconds */
		struct timespec ts = {.tv_sec = tv ? tv->tv_sec + tv->tv_usec / 1000000 : 0,
			.tv_nsec = tv ? tv->tv_usec % 1000000 * 1000 : 0};
		long long timeout = tv ? ts_ns(&ts) : -1, start = tv ? mono_ns() : 0;
		int res = select_engine(nfds, r, w, x, timeout, NULL);
		if (res != -2) {
			if (tv && timeout >= 0) {
				int saved = errno;
				ts = time_left(timeout, start);
				*tv = (struct timeval){.tv_sec = ts.tv_sec, .tv_usec = ts.tv_nsec / 1000};
				errno = saved;
			}
			return res;
		}
	}
	return REAL(select)(nfds, r, w, x, tv);
}

int pselect(int nfds, fd_set *r, fd_set *w, fd_set *x, const struct timespec *ts, const sigset_t *mask)
{
	pay_owed();
	if (vmx_forked)
		claim_set(nfds, r, w, x);
	else if (bad_ts(ts)) {
		errno = EINVAL;
		return -1;
	} else {
		int res = select_engine(nfds, r, w, x, ts_ns(ts), mask);
		if (res != -2)
			return res;
	}
	return REAL(pselect)(nfds, r, w, x, ts, mask);
}

int epoll_create(int size)
{
	int fd = REAL(epoll_create)(size);
	mark_epfd(fd, 1);
	return fd;
}

int epoll_create1(int flags)
{
	int fd = REAL(epoll_create1)(flags);
	mark_epfd(fd, 1);
	return fd;
}

int epoll_ctl(int ep, int op, int fd, struct epoll_event *ev)
{
	if (op != EPOLL_CTL_DEL)
		claim(fd);
	int r = REAL(epoll_ctl)(ep, op, fd, ev);
	int s = state(fd);
	if (r != 0)
		return r;
	if (epfd(fd)) /* an epoll set in another */
		vmx_set_state(ep, vmxgo_epoll_nest(ep, op, fd, ev));
	else if (s == VMX_CANDIDATE || s == VMX_OFFLOADED || s == VMX_TCP || state(ep) == VMX_EPOLL)
		vmx_set_state(ep, vmxgo_epoll_ctl(ep, op, fd, ev));
	return r;
}

/* rang says whether the bell of a shared set (VMX_BELL_DATA) is among the
 * n events. */
static int rang(const struct epoll_event *ev, int n)
{
	for (int i = 0; i < n; i++)
		if (ev[i].data.u64 == VMX_BELL_DATA)
			return 1;
	return 0;
}

/* drop_bells takes the bells' events out of a forked child's: the
 * parent's shared sets are its too, and their bells still ring. */
static int drop_bells(struct epoll_event *ev, int n)
{
	int k = 0;
	for (int i = 0; i < n; i++)
		if (ev[i].data.u64 != VMX_BELL_DATA)
			ev[k++] = ev[i];
	return k;
}

/* shared_wait is the kernel's epoll_pwait (epoll_pwait2 with ts) on a set
 * the engine passed to it, a shared set: when its bell rang, the engine
 * takes its event out and adds the connections the set owes; when only
 * the bell came, the wait goes on for what is left of its timeout. */
static int shared_wait(int epfd, struct epoll_event *ev, int max, int timeout, const struct timespec *ts, const sigset_t *mask)
{
	long long ns = ts ? ts_ns(ts) : (timeout < 0 ? -1 : (long long)timeout * 1000000);
	long long start = ns > 0 ? mono_ns() : 0;
	for (;;) {
		int r;
		if (ts) {
			struct timespec left = ns < 0 ? *ts : time_left(ns, start);
#ifdef SYS_epoll_pwait2
			r = (int)sys(SYS_epoll_pwait2, epfd, ev, max, &left, mask, _NSIG / 8);
#else
			errno = ENOSYS;
			r = -1;
#endif
		} else {
			long long left = ns;
			if (ns > 0) {
				left = ns - (mono_ns() - start);
				left = left < 0 ? 0 : left;
			}
			r = REAL(epoll_pwait)(epfd, ev, max, left < 0 ? -1 : (int)((left + 999999) / 1000000), mask);
		}
		if (r <= 0 || !rang(ev, r))
			return r;
		r = vmxgo_epoll_rung(epfd, ev, r, max);
		if (r != 0 || ns == 0 || (ns > 0 && mono_ns() - start >= ns))
			return r;
	}
}

int epoll_pwait(int epfd, struct epoll_event *ev, int max, int timeout, const sigset_t *mask)
{
	if (state(epfd) == VMX_EPOLL) {
		long r = CANCEL_POINT(vmxgo_epoll_wait(epfd, ev, max, timeout < 0 ? -1 : (long long)timeout * 1000000, (void *)mask, vmx_thread()));
		if (r != -VMX_PASS)
			return (int)ret(r);
		return shared_wait(epfd, ev, max, timeout, NULL, mask);
	}
	int r = REAL(epoll_pwait)(epfd, ev, max, timeout, mask);
	return vmx_forked && r > 0 ? drop_bells(ev, r) : r;
}

/* epoll_pwait2 (glibc 2.35, Linux 5.11) is epoll_pwait with a timespec:
 * libevent 2.2 waits with it where the C library has it. Left to the
 * kernel, it slept on a set whose offloaded sockets get nothing there. */
int epoll_pwait2(int epfd, struct epoll_event *ev, int max, const struct timespec *ts, const sigset_t *mask)
{
	if (state(epfd) == VMX_EPOLL) {
		if (bad_ts(ts)) {
			errno = EINVAL;
			return -1;
		}
		long r = CANCEL_POINT(vmxgo_epoll_wait(epfd, ev, max, ts_ns(ts), (void *)mask, vmx_thread()));
		if (r != -VMX_PASS)
			return (int)ret(r);
		if (ts)
			return shared_wait(epfd, ev, max, 0, ts, mask);
		return shared_wait(epfd, ev, max, -1, NULL, mask);
	}
	int r;
	if (REAL(epoll_pwait2))
		r = REAL(epoll_pwait2)(epfd, ev, max, ts, mask);
	else {
#ifdef SYS_epoll_pwait2
		r = (int)sys(SYS_epoll_pwait2, epfd, ev, max, ts, mask, _NSIG / 8);
#else
		errno = ENOSYS;
		return -1;
#endif
	}
	return vmx_forked && r > 0 ? drop_bells(ev, r) : r;
}

/* The raw ppoll and pselect6 write what is left of the timeout back, as
 * libc's wrappers do not: served by the engine, so do they. -2: not an
 * engine wait, the kernel's call. */
static long raw_ppoll(struct pollfd *fds, nfds_t n, struct timespec *ts, const sigset_t *mask)
{
	pay_owed();
	if (!any_engine_fd(fds, n))
		return -2;
	if (bad_ts(ts)) {
		errno = EINVAL;
		return -1;
	}
	long long timeout = ts_ns(ts), start = mono_ns();
	long r = ret(CANCEL_POINT(vmxgo_poll(VMX_MUX_POLL, fds, n, timeout, (void *)mask, vmx_thread())));
	if (ts && timeout >= 0)
		*ts = time_left(timeout, start);
	return r;
}

static long raw_pselect6(int nfds, fd_set *r, fd_set *w, fd_set *x, struct timespec *ts, const sigset_t *mask)
{
	pay_owed();
	if (vmx_forked) {
		claim_set(nfds, r, w, x);
		return -2;
	}
	if (bad_ts(ts)) {
		errno = EINVAL;
		return -1;
	}
	long long timeout = ts_ns(ts), start = mono_ns();
	int res = select_engine(nfds, r, w, x, timeout, mask);
	if (res != -2 && ts && timeout >= 0) {
		int saved = errno;
		*ts = time_left(timeout, start);
		errno = saved;
	}
	return res;
}

int epoll_wait(int epfd, struct epoll_event *ev, int max, int timeout)
{
	if (state(epfd) == VMX_EPOLL)
		return epoll_pwait(epfd, ev, max, timeout, NULL);
	int r = REAL(epoll_wait)(epfd, ev, max, timeout);
	return vmx_forked && r > 0 ? drop_bells(ev, r) : r;
}

/* syscall(2) reaches the wrappers above for the calls they serve. Some
 * programs make their socket calls through it rather than through libc's
 * names: libuv before 1.45 does so for recvmmsg and sendmmsg, with which
 * BIND 9.18 reads and answers its UDP sockets, and the kernel served those
 * on the kernel socket, which offload leaves empty (named answered
 * nothing). The kernel forms that differ from libc's are served as the
 * kernel serves them: pselect6 takes its signal set through a pointer,
 * and it and ppoll write the time left back. One with a signal set of
 * another size than the kernel's goes to the kernel, which refuses it. */
long syscall(long nr, ...)
{
	va_list ap;
	va_start(ap, nr);
	long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long);
	long d = va_arg(ap, long), e = va_arg(ap, long), f = va_arg(ap, long);
	va_end(ap);
	switch (nr) {
	case SYS_exit_group:
		vmx_exit_flush();
		break;
	case SYS_socket:
		return socket((int)a, (int)b, (int)c);
	case SYS_bind:
		return bind((int)a, (const struct sockaddr *)b, (socklen_t)c);
	case SYS_connect:
		return connect((int)a, (const struct sockaddr *)b, (socklen_t)c);
	case SYS_listen:
		return listen((int)a, (int)b);
	case SYS_accept:
		return accept((int)a, (struct sockaddr *)b, (socklen_t *)c);
	case SYS_accept4:
		return accept4((int)a, (struct sockaddr *)b, (socklen_t *)c, (int)d);
	case SYS_shutdown:
		return shutdown((int)a, (int)b);
	case SYS_getsockname:
		return getsockname((int)a, (struct sockaddr *)b, (socklen_t *)c);
	case SYS_getpeername:
		return getpeername((int)a, (struct sockaddr *)b, (socklen_t *)c);
	case SYS_getsockopt:
		return getsockopt((int)a, (int)b, (int)c, (void *)d, (socklen_t *)e);
	case SYS_setsockopt:
		return setsockopt((int)a, (int)b, (int)c, (const void *)d, (socklen_t)e);
	case SYS_close:
		return close((int)a);
	case SYS_close_range:
		return close_range((unsigned int)a, (unsigned int)b, (int)c);
	case SYS_dup:
		return dup((int)a);
#ifdef SYS_dup2
	case SYS_dup2:
		return dup2((int)a, (int)b);
#endif
	case SYS_dup3:
		return dup3((int)a, (int)b, (int)c);
	case SYS_fcntl:
		return fcntl((int)a, (int)b, c);
	case SYS_ioctl:
		return ioctl((int)a, (unsigned long)b, c);
	case SYS_read:
		return read((int)a, (void *)b, (size_t)c);
	case SYS_readv:
		return readv((int)a, (const struct iovec *)b, (int)c);
	case SYS_recvfrom:
		return recvfrom((int)a, (void *)b, (size_t)c, (int)d, (struct sockaddr *)e, (socklen_t *)f);
	case SYS_recvmsg:
		return recvmsg((int)a, (struct msghdr *)b, (int)c);
	case SYS_recvmmsg:
		return recvmmsg((int)a, (struct mmsghdr *)b, (unsigned int)c, (int)d, (struct timespec *)e);
	case SYS_write:
		return write((int)a, (const void *)b, (size_t)c);
	case SYS_writev:
		return writev((int)a, (const struct iovec *)b, (int)c);
	case SYS_sendto:
		return sendto((int)a, (const void *)b, (size_t)c, (int)d, (const struct sockaddr *)e, (socklen_t)f);
	case SYS_sendmsg:
		return sendmsg((int)a, (const struct msghdr *)b, (int)c);
	case SYS_sendmmsg:
		return sendmmsg((int)a, (struct mmsghdr *)b, (unsigned int)c, (int)d);
	case SYS_sendfile:
		return sendfile((int)a, (int)b, (off_t *)c, (size_t)d);
	case SYS_splice:
		return splice((int)a, (loff_t *)b, (int)c, (loff_t *)d, (size_t)e, (unsigned int)f);
#ifdef SYS_poll
	case SYS_poll:
		return poll((struct pollfd *)a, (nfds_t)b, (int)c);
#endif
#ifdef SYS_select
	case SYS_select:
		return select((int)a, (fd_set *)b, (fd_set *)c, (fd_set *)d, (struct timeval *)e);
#endif
#ifdef SYS_epoll_create
	case SYS_epoll_create:
		return epoll_create((int)a);
#endif
	case SYS_epoll_create1:
		return epoll_create1((int)a);
	case SYS_epoll_ctl:
		return epoll_ctl((int)a, (int)b, (int)c, (struct epoll_event *)d);
#ifdef SYS_epoll_wait
	case SYS_epoll_wait:
		return epoll_wait((int)a, (struct epoll_event *)b, (int)c, (int)d);
#endif
	case SYS_epoll_pwait:
		if (e == 0 || f == _NSIG / 8) /* the kernel's sigset_t, which libc passes */
			return epoll_pwait((int)a, (struct epoll_event *)b, (int)c, (int)d, (const sigset_t *)e);
		break;
#ifdef SYS_epoll_pwait2
	case SYS_epoll_pwait2:
		if (e == 0 || f == _NSIG / 8)
			return epoll_pwait2((int)a, (struct epoll_event *)b, (int)c, (const struct timespec *)d, (const sigset_t *)e);
		break;
#endif
	case SYS_ppoll:
		if (d == 0 || e == _NSIG / 8) {
			long r = raw_ppoll((struct pollfd *)a, (nfds_t)b, (struct timespec *)c, (const sigset_t *)d);
			if (r != -2)
				return r;
		}
		break;
	case SYS_pselect6: {
		/* the sixth argument points to the signal set and its size */
		const struct { const sigset_t *set; size_t size; } *sig = (void *)f;
		if (!sig || !sig->set || sig->size == _NSIG / 8) {
			long r = raw_pselect6((int)a, (fd_set *)b, (fd_set *)c, (fd_set *)d, (struct timespec *)e, sig ? sig->set : NULL);
			if (r != -2)
				return r;
		}
		break;
	}
	}
	return sys(nr, a, b, c, d, e, f);
}

/* vfork's child shares the parent's memory, engine included: run it as a
 * fork, as VMA does. */
pid_t vfork(void) { return REAL(fork)(); }

/* claim_for_exec: a forked child about to exec, or to spawn a program,
 * claims the parent's kept sockets that the program inherits: those not
 * close-on-exec (socket activation, a server's binary upgrade). */
static void claim_for_exec(void)
{
	if (!vmx_forked || !vmx_fork_page)
		return;
	for (int fd = 0; fd < VMX_MAXFD; fd++)
		if (vmx_state[fd] == VMX_OFFLOADED || vmx_state[fd] == VMX_TCP) {
			long fl = sys(SYS_fcntl, fd, F_GETFD, 0);
			if (fl >= 0 && !(fl & FD_CLOEXEC))
				claim(fd);
		}
}

/* before_exec: the process is about to become another program. The
 * engine goes with its image, so what sends left on the TX rings leaves
 * now (vmx_exit_flush), a forked child claims its sockets, and the
 * connections the program inherits move to kernel sockets. */
static void before_exec(void)
{
	vmx_exit_flush();
	claim_for_exec();
	if (vmx_ready && !vmx_forked)
		vmxgo_execing();
}

/* The exec family: glibc's own calls between them do not come back here,
 * so each is wrapped. */
DECLARE(int, execve, const char *, char *const[], char *const[]);
DECLARE(int, execv, const char *, char *const[]);
DECLARE(int, execvp, const char *, char *const[]);
DECLARE(int, execvpe, const char *, char *const[], char *const[]);
DECLARE(int, fexecve, int, char *const[], char *const[]);
DECLARE(int, posix_spawn, pid_t *, const char *, const posix_spawn_file_actions_t *, const posix_spawnattr_t *,
	char *const[], char *const[]);
DECLARE(int, posix_spawnp, pid_t *, const char *, const posix_spawn_file_actions_t *, const posix_spawnattr_t *,
	char *const[], char *const[]);

int execve(const char *path, char *const argv[], char *const envp[])
{
	before_exec();
	return REAL(execve)(path, argv, envp);
}

int execv(const char *path, char *const argv[])
{
	before_exec();
	return REAL(execv)(path, argv);
}

int execvp(const char *file, char *const argv[])
{
	before_exec();
	return REAL(execvp)(file, argv);
}

int execvpe(const char *file, char *const argv[], char *const envp[])
{
	before_exec();
	return REAL(execvpe)(file, argv, envp);
}

int fexecve(int fd, char *const argv[], char *const envp[])
{
	before_exec();
	return REAL(fexecve)(fd, argv, envp);
}

int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa, const posix_spawnattr_t *attr,
		char *const argv[], char *const envp[])
{
	claim_for_exec();
	return REAL(posix_spawn)(pid, path, fa, attr, argv, envp);
}

int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa, const posix_spawnattr_t *attr,
		 char *const argv[], char *const envp[])
{
	claim_for_exec();
	return REAL(posix_spawnp)(pid, file, fa, attr, argv, envp);
}

/* The list forms gather their arguments (up to the NULL, and execle's
 * environment after it; glibc declares arg non-null) and go through the
 * vector forms above. */
#define GATHER_ARGS(arg, argv)                                        \
	size_t n_ = 1;                                                \
	va_list ap_;                                                  \
	va_start(ap_, arg);                                           \
	while (va_arg(ap_, const char *))                             \
		n_++;                                                 \
	va_end(ap_);                                                  \
	char **argv = __builtin_alloca((n_ + 1) * sizeof(char *));    \
	argv[0] = (char *)arg;                                        \
	va_start(ap_, arg);                                           \
	for (size_t i_ = 1; i_ <= n_; i_++)                           \
		argv[i_] = va_arg(ap_, char *);

int execl(const char *path, const char *arg, ...)
{
	GATHER_ARGS(arg, argv)
	va_end(ap_);
	return execv(path, argv);
}

int execlp(const char *file, const char *arg, ...)
{
	GATHER_ARGS(arg, argv)
	va_end(ap_);
	return execvp(file, argv);
}

int execle(const char *path, const char *arg, ...)
{
	GATHER_ARGS(arg, argv)
	char **envp = va_arg(ap_, char **);
	va_end(ap_);
	return execve(path, argv, envp);
}

/* A process that gives up root (a daemon that drops to its own user
 * before it opens its sockets, as mosquitto does for good and FreeRADIUS
 * does for the time between its privileged calls) could not open a stack
 * afterwards: the engine opens them before (Engine.BeforeSetuid). glibc's
 * seteuid reaches the kernel without its setresuid, so it is wrapped too.
 * -1 is (uid_t)-1, "unchanged". */
DECLARE(int, setuid, uid_t);
DECLARE(int, seteuid, uid_t);
DECLARE(int, setreuid, uid_t, uid_t);
DECLARE(int, setresuid, uid_t, uid_t, uid_t);

static void before_setuid(const char *call, uid_t r, uid_t e, uid_t s)
{
	if (vmx_ready && !vmx_forked)
		vmxgo_before_setuid((char *)call, r == (uid_t)-1 ? -1 : (long)r, e == (uid_t)-1 ? -1 : (long)e,
			s == (uid_t)-1 ? -1 : (long)s);
}

int setuid(uid_t uid)
{
	before_setuid("setuid", uid, uid, uid);
	return REAL(setuid)(uid);
}

int seteuid(uid_t e)
{
	before_setuid("seteuid", (uid_t)-1, e, (uid_t)-1);
	return REAL(seteuid)(e);
}

int setreuid(uid_t r, uid_t e)
{
	before_setuid("setreuid", r, e, (uid_t)-1);
	return REAL(setreuid)(r, e);
}

int setresuid(uid_t r, uid_t e, uid_t s)
{
	before_setuid("setresuid", r, e, s);
	return REAL(setresuid)(r, e, s);
}

/* A chroot hides what a stack needs to open (Engine.BeforeChroot). */
DECLARE(int, chroot, const char *);

int chroot(const char *path)
{
	if (vmx_ready && !vmx_forked)
		vmxgo_before_chroot((char *)path);
	return REAL(chroot)(path);
}

/* Go's threads (its Ms) are made by its runtime/cgo, in this library,
 * with pthread_create. A new thread takes its creator's name, so Go's
 * threads were named after whichever application thread's call made
 * them: `top -H` of pdns_recursor listed three rec/worker threads for its
 * two workers. They are named vmaxdp (go_thread).
 *
 * Go's sysmon thread runs SCHED_BATCH (preload's quietSysmon), and it is
 * the thread that creates Go's new threads (startm when it takes a P from a
 * thread in a system call). A thread inherits its creator's policy, and
 * SCHED_RESET_ON_FORK resets only real-time ones, so the threads sysmon
 * creates are made SCHED_OTHER here: they run the engine's goroutines,
 * whose wake-ups must preempt as any thread's do. The application's
 * pthread_create calls are passed on as they are. */
int vmx_sysmon_tid;
DECLARE(int, pthread_create, pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

struct go_start {
	void *(*fn)(void *);
	void *arg;
};

static void *go_thread(void *p)
{
	struct go_start s = *(struct go_start *)p;
	free(p);
	prctl(PR_SET_NAME, "vmaxdp");
	return s.fn(s.arg);
}

/* from_self says whether code at pc is this library's. */
static int from_self(void *pc)
{
	Dl_info caller, self;
	return dladdr(pc, &caller) && dladdr((void *)go_thread, &self) &&
	       caller.dli_fbase == self.dli_fbase;
}

static int create_go_thread(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
	int sysmon = __atomic_load_n(&vmx_sysmon_tid, __ATOMIC_RELAXED);
	if (!sysmon || sysmon != (int)sys(SYS_gettid))
		return REAL(pthread_create)(t, attr, fn, arg);
	pthread_attr_t own;
	const pthread_attr_t *a = attr;
	if (pthread_getattr_default_np(&own) != 0)
		return REAL(pthread_create)(t, attr, fn, arg);
	if (attr) {
		/* Go's runtime/cgo passes an attr of its own (its stack size
		 * is the new thread's stack bound): a copy of what it may set,
		 * the policy apart. */
		size_t n;
		int detach;
		if (pthread_attr_getstacksize(attr, &n) == 0)
			pthread_attr_setstacksize(&own, n);
		if (pthread_attr_getguardsize(attr, &n) == 0)
			pthread_attr_setguardsize(&own, n);
		if (pthread_attr_getdetachstate(attr, &detach) == 0)
			pthread_attr_setdetachstate(&own, detach);
	}
	struct sched_param none = {0};
	if (pthread_attr_setinheritsched(&own, PTHREAD_EXPLICIT_SCHED) == 0 &&
	    pthread_attr_setschedpolicy(&own, SCHED_OTHER) == 0 &&
	    pthread_attr_setschedparam(&own, &none) == 0)
		a = &own;
	int r = REAL(pthread_create)(t, a, fn, arg);
	pthread_attr_destroy(&own);
	return r;
}

int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
	if (!from_self(__builtin_return_address(0)))
		return REAL(pthread_create)(t, attr, fn, arg);
	struct go_start *s = malloc(sizeof *s);
	if (!s)
		return create_go_thread(t, attr, fn, arg); /* unnamed, still made */
	s->fn = fn;
	s->arg = arg;
	int r = create_go_thread(t, attr, go_thread, s);
	if (r != 0)
		free(s);
	return r;
}

/* A thread that enters another network namespace: the engine's answers
 * for the process's own namespace no longer hold for every thread
 * (Engine.NetnsMoved). */
DECLARE(int, setns, int, int);
DECLARE(int, unshare, int);

int setns(int fd, int nstype)
{
	int r = REAL(setns)(fd, nstype);
	if (r == 0 && vmx_ready && !vmx_forked && (nstype == 0 || nstype & CLONE_NEWNET))
		vmxgo_netns_moved();
	return r;
}

int unshare(int flags)
{
	int r = REAL(unshare)(flags);
	if (r == 0 && vmx_ready && !vmx_forked && (flags & CLONE_NEWNET))
		vmxgo_netns_moved();
	return r;
}
