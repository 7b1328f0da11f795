#!/bin/bash
# bench/tcp.sh: unmodified TCP programs from Debian (redis-server under
# redis-benchmark, iperf3 with 4 streams and in reverse, sockperf --tcp
# ping-pong and throughput with 64-byte messages, knot over TCP with a
# SO_REUSEPORT group of two listeners driven by dnsperf -m tcp, memcached
# with four worker threads under memcaslap, lighttpd under ab with
# keep-alive and with a connection a request, nginx as one process under
# ab with keep-alive) with vmaxdp
# (VMAXDP_TCP=1) under the server, the client, both and neither, on a
# plain bed (as `ip link add` makes it), in interleaved rounds whose
# placements rotate; it prints the median rates and the median of each
# placement's per-round ratio to the kernel's rate of the same round.
#
#   bench/tcp.sh [-rounds N] [-duration D] [-apps a,b] [-tuned]
#
# Needs root, the programs (make deps) and bin/vmaxdp + bin/libvmaxdp.so
# (make build).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x bin/vmaxdp ] && [ -f bin/libvmaxdp.so ] || { echo "bench/tcp.sh: build first (make build)" >&2; exit 1; }
exec ./bin/vmaxdp bench apps -rounds 5 -duration 2s -env VMAXDP_TCP=1 \
	-apps redis,iperf3-tcp-P4,iperf3-tcp-R,sockperf-tcp-pp,sockperf-tcp-tp,knot-tcp-2workers,memcached-tcp,lighttpd-keepalive,lighttpd-close,nginx-keepalive "$@"
