#!/bin/bash
# bench/sockperf.sh: unmodified sockperf on the kernel and under `vmaxdp run`,
# side by side in one run on a fresh test bed, with each figure's ratio to
# the kernel's (blocking and busy-polling kernel both).
#
#   bench/sockperf.sh [-t SECONDS] [-m SIZE] [-bed NAME] [-tuned]
#
# The bed is plain (as `ip link add` makes it: TX checksum offload on, the
# kernel's default queues) unless -tuned.
#
# Needs root, sockperf and bin/vmaxdp + bin/libvmaxdp.so (make build).
set -euo pipefail
cd "$(dirname "$0")/.."
T=3 M=64 BED=sockbench KIND=-plain
while [ $# -gt 0 ]; do
	case "$1" in
	-t) T=$2; shift 2 ;;
	-m) M=$2; shift 2 ;;
	-bed) BED=$2; shift 2 ;;
	-tuned) KIND=""; shift ;;
	*) echo "usage: $0 [-t SECONDS] [-m SIZE] [-bed NAME] [-tuned]" >&2; exit 2 ;;
	esac
done
V=./bin/vmaxdp
[ -x $V ] && [ -f bin/libvmaxdp.so ] || { echo "bench/sockperf.sh: build first (make build)" >&2; exit 1; }
command -v sockperf >/dev/null || { echo "bench/sockperf.sh: sockperf not installed" >&2; exit 1; }
$V testbed up -name "$BED" $KIND >/dev/null
trap '$V testbed down -name "$BED" >/dev/null' EXIT
A=vmx-$BED-a B=vmx-$BED-b IP=198.18.0.2 PORT=11300
OUT=$(mktemp -d)
trap '$V testbed down -name "$BED" >/dev/null; rm -rf "$OUT"' EXIT

# run NAME SERVER-PREFIX CLIENT-PREFIX SERVER-EXTRA -- CLIENT-ARGS...
run() {
	local name=$1 sp=$2 cp=$3 sx=$4; shift 5
	PORT=$((PORT + 1))
	ip netns exec $B $sp sockperf sr -i $IP -p $PORT $sx >"$OUT/$name.srv" 2>&1 &
	local pid=$!
	for _ in $(seq 200); do grep -q "to block on socket" "$OUT/$name.srv" && break; sleep 0.05; done
	ip netns exec $A $cp sockperf "$@" -i $IP -p $PORT -t "$T" -m "$M" >"$OUT/$name.cli" 2>&1 || true
	kill -INT $pid 2>/dev/null; wait $pid 2>/dev/null || true
}
VR="$V run --"
run k-block "" "" "" -- pp
run k-spin "" "" "--nonblocked" -- pp --nonblocked
run v-block "$VR" "$VR" "" -- pp
run v-spin "$VR" "$VR" "--nonblocked" -- pp --nonblocked
run k-tp "" "" "" -- tp
run v-tp "$VR" "$VR" "" -- tp

field() { # field FILE REGEX: the number after the regex
	sed -n -E "s/.*$2 *([0-9.]+).*/\1/p" "$1" | head -1
}
lat() { # avg p50 p99 p99.9 of a pp run
	local f=$OUT/$1.cli
	echo "$(field "$f" 'Latency is') $(field "$f" 'percentile 50.000 =') $(field "$f" 'percentile 99.000 =') $(field "$f" 'percentile 99.900 =')"
}
ratio() { [ -n "$1" ] && [ -n "$2" ] && echo "scale=3; $1 / $2" | bc || echo "-"; }

printf "sockperf %s B, %ss per run, test bed %s (veth, %s)\n\n" "$M" "$T" "$BED" "$($V testbed status | sed -n "s/^$BED: .*MTU [0-9]*, //p")"
printf "%-28s %9s %9s %9s %9s %10s %10s\n" "ping-pong latency (usec)" avg p50 p99 p99.9 "avg/k-blk" "avg/k-spin"
read -r kba kb50 kb99 kb999 <<<"$(lat k-block)"
read -r ksa ks50 ks99 ks999 <<<"$(lat k-spin)"
for c in k-block k-spin v-block v-spin; do
	read -r a p50 p99 p999 <<<"$(lat $c)"
	case $c in
	k-block) label="kernel, blocking" ;; k-spin) label="kernel, --nonblocked spin" ;;
	v-block) label="vmaxdp, blocking" ;; v-spin) label="vmaxdp, --nonblocked" ;;
	esac
	printf "%-28s %9s %9s %9s %9s %10s %10s\n" "$label" "$a" "$p50" "$p99" "$p999" "$(ratio "$a" "$kba")" "$(ratio "$a" "$ksa")"
done
kt=$(field "$OUT/k-tp.cli" 'Message Rate is')
vt=$(field "$OUT/v-tp.cli" 'Message Rate is')
kr=$(field "$OUT/k-tp.srv" 'Total')
vr=$(field "$OUT/v-tp.srv" 'Total')
printf "\n%-28s %12s %14s %10s\n" "throughput" "sent msg/s" "server got" "rate/kernel"
printf "%-28s %12s %14s %10s\n" "kernel" "$kt" "$kr" "1"
printf "%-28s %12s %14s %10s\n" "vmaxdp (both sides)" "$vt" "$vr" "$(ratio "$vt" "$kt")"
for c in k-block k-spin v-block v-spin; do
	grep -q "dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0" "$OUT/$c.cli" ||
		{ echo "$c: messages dropped, duplicated or out of order:"; grep -E "dropped|No messages" "$OUT/$c.cli"; }
done
