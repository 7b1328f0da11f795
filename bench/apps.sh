#!/bin/bash
# bench/apps.sh: unmodified programs from Debian (knot, unbound, dnsmasq,
# nsd and memcached's UDP protocol under their load generators, iperf3 with
# 64 and 1400 B datagrams) with vmaxdp under the server, the client, both
# and neither, on a plain bed (as `ip link add` makes it). Each round runs
# every placement of every program, in an order rotated per round; it
# prints the median rates and the median of each placement's per-round
# ratio to the kernel's rate of the same round.
#
#   bench/apps.sh [-rounds N] [-duration D] [-apps a,b] [-tuned]
#
# Needs root, the programs (make deps) and bin/vmaxdp + bin/libvmaxdp.so
# (make build).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x bin/vmaxdp ] && [ -f bin/libvmaxdp.so ] || { echo "bench/apps.sh: build first (make build)" >&2; exit 1; }
exec ./bin/vmaxdp bench apps -rounds 5 -duration 2s "$@"
