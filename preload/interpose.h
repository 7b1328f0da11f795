/* Shared between the interposer (interpose.c) and the Go exports (main.go). */
#ifndef VMAXDP_INTERPOSE_H
#define VMAXDP_INTERPOSE_H

/* What the interposer knows about an fd; the values of engine.State. */
enum { VMX_OS = 0, VMX_CANDIDATE = 1, VMX_OFFLOADED = 2, VMX_EPOLL = 3, VMX_KERNEL = 4, VMX_TCP = 5 };

/* In a forked child: a VMX_TCP fd of the parent whose use was logged. */
#define VMX_TCP_ORPHAN 6

/* Multiplexers, for their counters: the values of engine.Mux. */
enum { VMX_MUX_SELECT = 0, VMX_MUX_POLL = 1, VMX_MUX_EPOLL = 2 };

/* Returned (negated) by the Go side when the kernel must serve the call:
 * engine.ErrPassOS. */
#define VMX_PASS 4095

#define VMX_MAXFD 65536

/* The epoll_data of a shared epoll set's bell, an eventfd of the engine's
 * in the set: engine.BellData. The kernel's epoll_wait on such a set
 * hands its events to vmxgo_epoll_rung when the bell is among them. */
#define VMX_BELL_DATA 0x8badf00d00766d78ULL

/* One listener's connections handed off at fork, queued on chan (a
 * SOCK_SEQPACKET socket, the same fd in every process): engine.Handoff. */
#define VMX_MAXHANDOFF 64
/* The source of the engine's knocks on a listener with handed connections
 * (stack.KnockAddr, host order, set as the library loads): an accept that
 * gets one closes it and takes a handed connection instead. */
extern unsigned int vmx_knock_addr;
/* Go's sysmon thread, made SCHED_BATCH by vmxgo_init (0: not). */
extern int vmx_sysmon_tid;
struct vmx_handoff {
	unsigned long long inode;      /* the listener's socket */
	unsigned long long chan_inode; /* chan's socket */
	int chan;
	int left; /* connections on chan */
	int open; /* 1 while the engine may queue more */
	int pad;
};

/* The page a process under vmaxdp shares with its children of fork:
 * engine.ForkPage. fd[i]: 0, not kept; -1, kept offloaded and claimable;
 * > 0, claimed by that child, which waits for the engine to set 0. */
struct vmx_fork_page {
	unsigned int seq;
	int engine_pid;
	unsigned int handoffs;
	int knocks;
	struct vmx_handoff handoff[VMX_MAXHANDOFF];
	int fd[VMX_MAXFD];
};

/* The signal handlers that ran on one thread: stack.Signals. */
struct vmx_signals {
	unsigned long long any;    /* every handler */
	unsigned long long intr;   /* handlers without SA_RESTART */
	unsigned long long cancel; /* a pthread_cancel waits for the call to end */
	long long resched, waited; /* the engine's: its waits' last Gosched, last start */
};

void vmx_set_state(int fd, int state);
void vmx_set_internal(int fd, int on);

/* engine.Options.Owed: the TCP connections whose mirrors epoll sets owe a
 * mark; poll and select have the engine pay them (vmxgo_tcp_pay) before
 * the kernel looks at the mirrors. */
extern int vmx_tcp_owed;

#endif
