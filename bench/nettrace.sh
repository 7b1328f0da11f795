#!/usr/bin/env bash
# bench/nettrace.sh: what recording costs, nettrace next to perf, in one run.
#
# On a fresh test bed, sockperf tp (UDP, 64 B) runs from namespace a to a
# sockperf server in namespace b: with nothing recording, under nettrace
# -aggregate, under nettrace per event, and under perf record, each with the
# same five packet-path tracepoints. ROUNDS rounds (default 3), the order of
# the four runs rotated each round so that a drift of the machine does not
# favour one; each run's rate is divided by the unrecorded rate of its own
# round, and the medians of those ratios are the result. The sockperf
# client and server are pinned to CPUs 0 and 1 when there are two, so that
# the scheduler moving them does not swamp what recording costs; the
# recorders are not pinned. Then the last round's recordings are read back
# with perf script, nettrace script and nettrace report.
#
# Run as root after `make build`; DURATION=secs per run, ROUNDS=n.
set -euo pipefail

D=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
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

PIN_SERVER= PIN_CLIENT=
if [ "$(nproc)" -ge 2 ]; then
	PIN_SERVER="taskset -c 1" PIN_CLIENT="taskset -c 0"
fi
"$BIN/vmaxdp" testbed up -name "$BED" >/dev/null
# shellcheck disable=SC2086
ip netns exec "$B" $PIN_SERVER sockperf sr -i 198.18.0.2 -p 11111 >/dev/null 2>&1 &
server=$!
sleep 1

# rate reads sockperf's message rate from its output on stdin.
rate() { awk '/Message Rate is/ { for (i = 1; i <= NF; i++) if ($i == "is") { print $(i + 1); exit } }'; }
TP="ip netns exec $A $PIN_CLIENT sockperf tp -i 198.18.0.2 -p 11111 -m 64 -t $D"

# run KIND prints the message rate of one sockperf tp run under KIND.
run() {
	case $1 in
	none) $TP 2>&1 | rate ;;
	aggregate) "$BIN/nettrace" record -aggregate -e "$EVENTS" -o "$TMP/agg.ntrace" -- $TP 2>/dev/null | rate ;;
	events) "$BIN/nettrace" record -e "$EVENTS" -o "$TMP/ev.ntrace" -- $TP 2>"$TMP/ev.log" | rate ;;
	# shellcheck disable=SC2086
	perf) perf record -q -a $PERF_EVENTS -o "$TMP/perf.data" -- $TP 2>/dev/null | rate ;;
	esac
}
ratio() { echo "scale=3; $1 / $2" | bc; }
# median prints the median of its arguments.
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

KINDS=(none aggregate events perf)
declare -A R
printf 'nettrace bench: sockperf tp UDP 64 B, %s rounds of %ss runs on test bed %s; events: %s\n' "$ROUNDS" "$D" "$BED" "$EVENTS"
[ -n "$PIN_CLIENT" ] && printf 'sockperf client on CPU 0, server on CPU 1\n'
printf '\n%-6s %12s %12s %8s %12s %8s %12s %8s\n' round none aggregate ratio events ratio perf ratio
for ((r = 0; r < ROUNDS; r++)); do
	declare -A M=()
	for ((k = 0; k < ${#KINDS[@]}; k++)); do
		kind=${KINDS[(k + r) % ${#KINDS[@]}]}
		M[$kind]=$(run "$kind")
	done
	for kind in aggregate events perf; do
		R[$kind]+=" $(ratio "${M[$kind]}" "${M[none]}")"
	done
	printf '%-6s %12s %12s %8s %12s %8s %12s %8s\n' "$((r + 1))" "${M[none]}" \
		"${M[aggregate]}" "$(ratio "${M[aggregate]}" "${M[none]}")" \
		"${M[events]}" "$(ratio "${M[events]}" "${M[none]}")" \
		"${M[perf]}" "$(ratio "${M[perf]}" "${M[none]}")"
done
# shellcheck disable=SC2086
agg=$(median ${R[aggregate]}) ev=$(median ${R[events]}) pf=$(median ${R[perf]})
printf '%-6s %12s %12s %8s %12s %8s %12s %8s\n' median "" "" "$agg" "" "$ev" "" "$pf"
printf '\nloss of message rate, medians: aggregate %.1f%%, per event %.1f%%, perf record %.1f%% (per event / perf: %s)\n' \
	"$(echo "100 * (1 - $agg)" | bc)" "$(echo "100 * (1 - $ev)" | bc)" "$(echo "100 * (1 - $pf)" | bc)" \
	"$(echo "scale=2; (1 - $ev) / (1 - $pf)" | bc)"

lost=$(sed -n 's/.* \([0-9]*\) lost.*/\1/p' "$TMP/ev.log" | tail -1)
pcount=$(perf script -i "$TMP/perf.data" 2>/dev/null | wc -l)
ncount=$(( $("$BIN/nettrace" script -i "$TMP/ev.ntrace" 2>/dev/null | grep -vc '^#') ))
printf '\nnettrace per-event recording (last round): %s events written, %s lost (counted per probe and CPU in the file)\n\n' "$ncount" "${lost:-0}"

# elapsed runs a command and prints its wall time in seconds.
elapsed() { local s e; s=$(date +%s%N); "$@" >/dev/null 2>&1; e=$(date +%s%N); echo "scale=3; ($e - $s) / 1000000000" | bc; }
ptime=$(elapsed perf script -i "$TMP/perf.data")
ntime=$(elapsed "$BIN/nettrace" script -i "$TMP/ev.ntrace")
rtime=$(elapsed "$BIN/nettrace" report -i "$TMP/ev.ntrace")

printf '%-34s %12s %10s %12s\n' "reading the recording back" "events" "seconds" "events/s"
pr=$(echo "$pcount / $ptime" | bc)
nr=$(echo "$ncount / $ntime" | bc)
rr=$(echo "$ncount / $rtime" | bc)
printf '%-34s %12s %10s %12s\n' "perf script" "$pcount" "$ptime" "$pr"
printf '%-34s %12s %10s %12s\n' "nettrace script" "$ncount" "$ntime" "$nr"
printf '%-34s %12s %10s %12s\n' "nettrace report" "$ncount" "$rtime" "$rr"
printf '%-34s %35s\n' "nettrace script / perf script" "$(ratio "$nr" "$pr")x"
printf '%-34s %35s\n' "nettrace report / perf script" "$(ratio "$rr" "$pr")x"
