/* Starting the peer-notification helper (package peernotify) from inside
 * an application, as a process that is not the application's child. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helper.h"

/* The kernel's struct sigaction (rt_sigaction), which libc's is not. */
struct vmx_ksigaction {
	void (*handler)(int);
	unsigned long flags;
	void (*restorer)(void);
	unsigned long mask;
};

struct vmx_spawn {
	/* libc's syscall: the interposer wraps the one this file would call,
	 * and its wrapper may enter the engine, which the children must not. */
	long (*sys)(long, ...);
	const char *path;
	char *const *argv;
	int fd;
	char *helper_stack; /* the top of the helper's stack until its exec */
	volatile int err;
	volatile int pid; /* the helper's */
};

/* vmx_spawn_child is the helper until its exec. It runs on its own stack
 * in the application's memory (CLONE_VM) while the process between waits
 * (CLONE_VFORK), and the application's thread waits for that one: raw
 * system calls only (s->sys), none of libc's wrappers, which the
 * interposer may have replaced. */
static int vmx_spawn_child(void *arg)
{
	struct vmx_spawn *s = arg;
	long (*sys)(long, ...) = s->sys;
	char *const envp[] = {NULL};

	/* A handler of the application would run on this stack in the
	 * parent's memory: every caught signal goes back to its default
	 * before any is unblocked (exec would reset them too late). */
	for (int sig = 1; sig < 65; sig++) {
		struct vmx_ksigaction old, dfl = {.handler = SIG_DFL};
		if (sig == SIGKILL || sig == SIGSTOP)
			continue;
		if (sys(SYS_rt_sigaction, sig, NULL, &old, 8) == 0 && old.handler != SIG_DFL && old.handler != SIG_IGN)
			sys(SYS_rt_sigaction, sig, &dfl, NULL, 8);
	}
	/* A session of its own: the terminal's ^C or hang-up, which end the
	 * application, must not end the helper that speaks for it. */
	sys(SYS_setsid);
	sys(SYS_chdir, "/");
	if (s->fd == 3)
		sys(SYS_fcntl, 3, F_SETFD, 0);
	else if (sys(SYS_dup3, s->fd, 3, 0) < 0)
		goto fail;
	long nul = sys(SYS_openat, AT_FDCWD, "/dev/null", O_RDWR);
	if (nul >= 0) {
		if (nul != 0)
			sys(SYS_dup3, nul, 0, 0);
		if (nul != 1)
			sys(SYS_dup3, nul, 1, 0);
	}
	/* fd 2 stays the application's stderr, where the helper reports. */
	if (sys(SYS_close_range, 4, ~0U, 0) < 0)
		for (int fd = 4; fd < 4096; fd++)
			sys(SYS_close, fd);
	unsigned long none = 0;
	sys(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, 8);
	sys(SYS_execve, s->path, s->argv, envp);
fail:
	s->err = errno ? errno : EINVAL;
	sys(SYS_exit, 127);
	return 0;
}

/* vmx_spawn_middle is the process between: it starts the helper and
 * ends as soon as the helper has exec'd, so that the helper's parent is
 * init (or the nearest subreaper), not the application. A child of the
 * application would be one more process its wait(-1) waits for (a prefork
 * master's "while (wait(&st) > 0)" never ended): an exec makes any child
 * signal SIGCHLD at its end, whatever clone said. This one never execs,
 * and its exit signal is 0: the application neither sees nor reaps it. */
static int vmx_spawn_middle(void *arg)
{
	struct vmx_spawn *s = arg;
	int pid = clone(vmx_spawn_child, s->helper_stack, CLONE_VM | CLONE_VFORK | SIGCHLD, s);
	if (pid < 0)
		s->err = errno;
	else
		s->pid = pid;
	s->sys(SYS_exit, 0);
	return 0;
}

int vmx_spawn_detached(const char *path, char *const argv[], int fd)
{
	enum { stack_size = 64 * 1024 };
	struct vmx_spawn s = {.sys = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall"), .path = path, .argv = argv, .fd = fd};
	if (!s.sys)
		return -ENOSYS;
	char *stacks = mmap(NULL, 2 * stack_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
	if (stacks == MAP_FAILED)
		return -errno;
	s.helper_stack = stacks + 2 * stack_size;
	unsigned long all = ~0UL, old;
	s.sys(SYS_rt_sigprocmask, SIG_SETMASK, &all, &old, 8);
	int pid = clone(vmx_spawn_middle, stacks + stack_size, CLONE_VM | CLONE_VFORK, &s);
	int err = pid < 0 ? errno : 0;
	if (pid > 0)
		s.sys(SYS_wait4, pid, NULL, __WALL, NULL);
	s.sys(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, 8);
	munmap(stacks, 2 * stack_size);
	if (!err)
		err = s.err;
	if (err)
		return -err;
	return s.pid;
}

const char *vmx_library_path(void)
{
	Dl_info info;
	if (!dladdr((void *)vmx_library_path, &info))
		return NULL;
	return info.dli_fname;
}
