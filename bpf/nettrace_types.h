// nettrace_types.h: the few kernel types nettrace.c reads, declared with
// preserve_access_index so that libbpf relocates every field against the
// running kernel's BTF. No offset here is trusted; only names are.
#pragma once

#include <linux/types.h>

#define __core __attribute__((preserve_access_index))

struct ns_common {
	unsigned int inum;
} __core;

struct net {
	struct ns_common ns;
} __core;

typedef struct {
	struct net *net;
} possible_net_t;

struct net_device {
	char name[16];
	int ifindex;
	possible_net_t nd_net;
} __core;

struct sock_common {
	possible_net_t skc_net;
} __core;

typedef struct {
	int counter;
} atomic_t;

struct sock {
	struct sock_common __sk_common;
	struct {
		atomic_t rmem_alloc;
	} sk_backlog;
	int sk_rcvbuf;
} __core;

struct sk_buff {
	struct net_device *dev;
	struct sock *sk;
	unsigned int len;
	unsigned int data_len;
	unsigned int truesize;
	__be16 protocol;
	__u16 network_header;
	__u16 mac_header;
	unsigned char *head;
	unsigned char *data;
} __core;

struct napi_struct {
	struct net_device *dev;
} __core;

struct bpf_prog_aux {
	__u32 id;
} __core;

struct bpf_prog {
	struct bpf_prog_aux *aux;
} __core;

struct task_struct {
	int pid;
	int tgid;
	char comm[16];
} __core;

struct proto;
