/* flowspec: builds the flow of each line of stdin with rdma-core's own
 * structs from <infiniband/verbs.h>, as VMA does, and prints its bytes in
 * hex, for TestFlowSpecLayout to compare with verbs.FlowSpec.
 *
 * A line: kind proto local-ip local-port remote-ip remote-port mac port
 * priority, kind one of 5tuple, 3tuple, mcast, port; proto udp or tcp.
 * The first line printed is the structs' sizes. */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>

struct flow {
	struct ibv_flow_attr attr;
	struct ibv_flow_spec_eth eth;
	struct ibv_flow_spec_ipv4 ipv4;
	struct ibv_flow_spec_tcp_udp l4;
} __attribute__((packed));

int main(void)
{
	char kind[16], proto[8], lip[32], rip[32], mac[32];
	unsigned lport, rport, port, prio;

	printf("sizes %zu %zu %zu %zu\n", sizeof(struct ibv_flow_attr), sizeof(struct ibv_flow_spec_eth),
	       sizeof(struct ibv_flow_spec_ipv4), sizeof(struct ibv_flow_spec_tcp_udp));
	while (scanf("%15s %7s %31s %u %31s %u %31s %u %u", kind, proto, lip, &lport, rip, &rport, mac, &port, &prio) == 9) {
		struct flow f;
		struct in_addr l, r;
		unsigned m[6];
		int full = !strcmp(kind, "5tuple"), any = !strcmp(kind, "port"), mc = !strcmp(kind, "mcast");

		memset(&f, 0, sizeof(f));
		inet_pton(AF_INET, lip, &l);
		inet_pton(AF_INET, rip, &r);
		sscanf(mac, "%x:%x:%x:%x:%x:%x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]);

		f.attr.type = IBV_FLOW_ATTR_NORMAL;
		f.attr.size = sizeof(f);
		f.attr.priority = prio;
		f.attr.num_of_specs = 3;
		f.attr.port = port;

		f.eth.type = IBV_FLOW_SPEC_ETH;
		f.eth.size = sizeof(f.eth);
		for (int i = 0; i < 6; i++)
			f.eth.val.dst_mac[i] = m[i];
		if (mc) {
			uint32_t g = ntohl(l.s_addr);
			uint8_t gm[6] = {0x01, 0x00, 0x5e, (g >> 16) & 0x7f, (g >> 8) & 0xff, g & 0xff};
			memcpy(f.eth.val.dst_mac, gm, 6);
		}
		memset(f.eth.mask.dst_mac, 0xff, 6);
		f.eth.val.ether_type = htons(0x0800);
		f.eth.mask.ether_type = 0xffff;

		f.ipv4.type = IBV_FLOW_SPEC_IPV4;
		f.ipv4.size = sizeof(f.ipv4);
		if (!any) {
			f.ipv4.val.dst_ip = l.s_addr;
			f.ipv4.mask.dst_ip = 0xffffffff;
		}
		if (full) {
			f.ipv4.val.src_ip = r.s_addr;
			f.ipv4.mask.src_ip = 0xffffffff;
		}

		f.l4.type = strcmp(proto, "tcp") ? IBV_FLOW_SPEC_UDP : IBV_FLOW_SPEC_TCP;
		f.l4.size = sizeof(f.l4);
		f.l4.val.dst_port = htons(lport);
		f.l4.mask.dst_port = 0xffff;
		if (full) {
			f.l4.val.src_port = htons(rport);
			f.l4.mask.src_port = 0xffff;
		}

		for (size_t i = 0; i < sizeof(f); i++)
			printf("%02x", ((unsigned char *)&f)[i]);
		printf("\n");
	}
	return 0;
}
