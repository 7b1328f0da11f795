#!/usr/bin/env bash
# bench/nettrace.sh: what recording costs, nettrace next to perf, in one run.
#
# On a fresh test bed, sockperf tp (UDP, 64 B) runs from namespace a to a
# sockperf server in namespace b: with nothing recording, under nettrace
# -aggregate, under nettrace per event, and under perf record, each with the
# same five packet-path tracepoints. Then the two recordings are read back
# with perf script, nettrace script and nettrace report. Prints message rates and read rates
# with their ratios. Run as root after `make build`; DURATION=secs per run.
set -euo pipefail

D=${DURATION:-5}
BIN=${BIN:-./bin}
BED=ntbench
A=vmx-$BED-a
B=vmx-$BED-b
EVENTS=netif_receive_skb,napi_poll,kfree_skb,consume_skb,skb_copy_datagram_iovec
PERF_EVENTS="-e net:netif_receive_skb -e napi:napi_poll -e skb:kfree_skb -e skb:consume_skb -e skb:skb_copy_datagram_iovec"
TMP=$(mktemp -d)
server=
cleanup() {
	[ -n "$server" ] && kill "$server" 2>/dev/null || true
	"$BIN/vmaxdp" testbed down -name "$BED" >/dev/null 2>&1 || true
	rm -rf "$TMP"
}
trap cleanup EXIT

"$BIN/vmaxdp" testbed up -name "$BED" >/dev/null
ip netns exec "$B" sockperf sr -i 198.18.0.2 -p 11111 >/dev/null 2>&1 &
server=$!
sleep 1

# rate reads sockperf's message rate from its output on stdin.
rate() { awk '/Message Rate is/ { for (i = 1; i <= NF; i++) if ($i == "is") { print $(i + 1); exit } }'; }
TP="ip netns exec $A sockperf tp -i 198.18.0.2 -p 11111 -m 64 -t $D"

base=$($TP 2>&1 | rate)
agg=$("$BIN/nettrace" record -aggregate -e "$EVENTS" -o "$TMP/agg.ntrace" -- $TP 2>/dev/null | rate)
ev=$("$BIN/nettrace" record -e "$EVENTS" -o "$TMP/ev.ntrace" -- $TP 2>"$TMP/ev.log" | rate)
# shellcheck disable=SC2086
pf=$(perf record -q -a $PERF_EVENTS -o "$TMP/perf.data" -- $TP 2>/dev/null | rate)
base2=$($TP 2>&1 | rate)

lost=$(sed -n 's/.* \([0-9]*\) lost.*/\1/p' "$TMP/ev.log" | tail -1)
pcount=$(perf script -i "$TMP/perf.data" 2>/dev/null | wc -l)
ncount=$(( $("$BIN/nettrace" script -i "$TMP/ev.ntrace" 2>/dev/null | grep -vc '^#') ))

# elapsed runs a command and prints its wall time in seconds.
elapsed() { local s e; s=$(date +%s%N); "$@" >/dev/null 2>&1; e=$(date +%s%N); echo "scale=3; ($e - $s) / 1000000000" | bc; }
ptime=$(elapsed perf script -i "$TMP/perf.data")
ntime=$(elapsed "$BIN/nettrace" script -i "$TMP/ev.ntrace")
rtime=$(elapsed "$BIN/nettrace" report -i "$TMP/ev.ntrace")

ratio() { echo "scale=3; $1 / $2" | bc; }
printf 'nettrace bench: sockperf tp UDP 64 B for %ss per run on test bed %s; events: %s\n\n' "$D" "$BED" "$EVENTS"
printf '%-34s %12s %8s\n' "sockperf tp while recording" "msg/s" "vs none"
printf '%-34s %12s %8s\n' "nothing (before)" "$base" "1.000"
printf '%-34s %12s %8s\n' "nettrace record -aggregate" "$agg" "$(ratio "$agg" "$base")"
printf '%-34s %12s %8s\n' "nettrace record (per event)" "$ev" "$(ratio "$ev" "$base")"
printf '%-34s %12s %8s\n' "perf record" "$pf" "$(ratio "$pf" "$base")"
printf '%-34s %12s %8s\n' "nothing (after)" "$base2" "$(ratio "$base2" "$base")"
printf '\nnettrace per-event recording: %s events written, %s lost (counted per probe and CPU in the file)\n\n' "$ncount" "${lost:-0}"
printf '%-34s %12s %10s %12s\n' "reading the recording back" "events" "seconds" "events/s"
pr=$(echo "$pcount / $ptime" | bc)
nr=$(echo "$ncount / $ntime" | bc)
printf '%-34s %12s %10s %12s\n' "perf script" "$pcount" "$ptime" "$pr"
printf '%-34s %12s %10s %12s\n' "nettrace script" "$ncount" "$ntime" "$nr"
rr=$(echo "$ncount / $rtime" | bc)
printf '%-34s %12s %10s %12s\n' "nettrace report" "$ncount" "$rtime" "$rr"
printf '%-34s %35s\n' "nettrace script / perf script" "$(ratio "$nr" "$pr")x"
printf '%-34s %35s\n' "nettrace report / perf script" "$(ratio "$rr" "$pr")x"
