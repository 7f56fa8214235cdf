#!/usr/bin/env bash
# KV transfer bandwidth across a network link between two hosts, side by side with ucx_perftest
# over the same link, in the same run.
#
# The hosts are Linux network namespaces: a "switch" namespace holds a bridge, and each host
# namespace has an eth0 (veth) plugged into it, one address per host on a private /24. Nothing
# is added to the machine's own namespace, and every namespace is removed on exit. Needs root.
#
#   perf/netns_kv.sh [BUILD_DIR]        (default: build; needs BUILD_DIR/perf/kv_link_bench)
#
# Host A runs `kv_link_bench serve` (a prefill's KV pool and publisher), host B
# `kv_link_bench pull` (a decode's puller), UCX_TLS=tcp bound to eth0, reading by authenticated
# active messages as the servers do over tcp; then ucx_perftest over the same link, server on A,
# client on B, with the same message size (32 KiB, one block of one layer) and 64 in flight:
# ucp_get (what RMA over tcp gives), ucp_get at 1 MiB, and ucp_am_bw (UCX's own active-message
# bandwidth: the ceiling of Tandem's reads; the last row's ratio is the 16k-token request's
# against it). Prints a table; raw numbers go to perf/results/netns_kv/ (git-ignored).
set -euo pipefail

build=$(realpath "${1:-build}")
bench="$build/perf/kv_link_bench"
[[ -x $bench ]] || { echo "no $bench: build the project first" >&2; exit 1; }
command -v ucx_perftest >/dev/null || { echo "ucx_perftest missing (apt-get install ucx-utils)" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "needs root (ip netns)" >&2; exit 1; }

out=$(realpath -m "$(dirname "$0")/results/netns_kv")
mkdir -p "$out"
work=$(mktemp -d /tmp/tandem-netns-kv.XXXXXX)
tag="tkv$$"
sw="${tag}sw" a="${tag}a" b="${tag}b"
subnet="10.213.$((RANDOM % 200 + 20))"
addr_a="$subnet.1" addr_b="$subnet.2"
port=$((20000 + RANDOM % 10000))

cleanup() {
  jobs -p | xargs -r kill 2>/dev/null || true
  for n in "$a" "$b" "$sw"; do ip netns del "$n" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$sw"
ip -n "$sw" link add br0 type bridge
ip -n "$sw" link set br0 up
i=0
for host in "$a" "$b"; do
  ip netns add "$host"
  ip -n "$host" link set lo up
  ip -n "$sw" link add eth0 netns "$host" type veth peer name "h$i"
  ip -n "$sw" link set "h$i" master br0
  ip -n "$sw" link set "h$i" up
  ip -n "$host" addr add "$subnet.$((i + 1))/24" dev eth0
  ip -n "$host" link set eth0 up
  i=$((i + 1))
done

echo "hosts: A $addr_a, B $addr_b (veth through a bridge, MTU $(ip -n "$a" -o link show eth0 | sed -n 's/.* mtu \([0-9]*\).*/\1/p'))"

# Tandem: publisher on A, puller on B.
ip netns exec "$a" "$bench" serve "$work" --net-devices eth0 --reps 5 >"$out/serve.log" 2>&1 &
for _ in $(seq 300); do [[ -e $work/ready ]] && break; sleep 0.1; done
[[ -e $work/ready ]] || { echo "publisher did not start:"; cat "$out/serve.log"; exit 1; }
(cd "$out" && ip netns exec "$b" "$bench" pull "$work" --net-devices eth0 --inflight 64) \
  >"$out/pull.txt" 2>"$out/pull.log"
wait

# ucx_perftest: the same transport, device, get size and gets in flight; and with 1 MiB gets, the
# link's peak for this transport.
run_perftest() {  # TEST SIZE ITERATIONS PORT -> MB/s (2^20) overall
  local args=(-t "$1" -s "$2" -n "$3" -w 50 -O 64 -f -p "$4")
  ip netns exec "$a" env UCX_TLS=tcp UCX_NET_DEVICES=eth0 timeout 120 ucx_perftest "${args[@]}" \
    >"$out/perftest_server_$1_$2.log" 2>&1 &
  sleep 1
  ip netns exec "$b" env UCX_TLS=tcp UCX_NET_DEVICES=eth0 timeout 120 ucx_perftest "$addr_a" \
    "${args[@]}" >"$out/perftest_$1_$2.txt" 2>&1
  wait
  # -f prints one row: iterations, latency p50 avg overall, bandwidth avg overall, rates.
  awk 'NF == 8 && $1 ~ /^[0-9]+$/ {bw = $6} END {print bw + 0}' "$out/perftest_$1_$2.txt"
}
perftest_mibps=$(run_perftest ucp_get 32768 20000 "$port")
perftest_peak_mibps=$(run_perftest ucp_get 1048576 1000 "$((port + 1))")
# Tandem's reads are active messages (rendezvous): UCX's own AM bandwidth is their ceiling.
perftest_am_mibps=$(run_perftest ucp_am_bw 32768 20000 "$((port + 2))")

printf "%-32s %10s %12s %12s %8s\n" "KV pull A -> B (UCX tcp, eth0)" "MiB" "best MiB/s" \
  "median MiB/s" "ratio"
printf "tokens\tMiB\ttandem_best_MiBps\ttandem_median_MiBps\tperftest_MiBps\tratio_best\n" \
  >"$out/netns_kv.tsv"
tail -n +2 "$out/kv_link_bench.tsv" | while IFS=$'\t' read -r tokens bytes gets best median bw_best bw_median; do
  mib=$(awk -v b="$bytes" 'BEGIN {printf "%.0f", b / 1048576}')
  ratio=$(awk -v t="$bw_best" -v p="$perftest_mibps" 'BEGIN {printf "%.2f", (p > 0 ? t / p : 0)}')
  printf "%-32s %10s %12.0f %12.0f %8s\n" "request of $tokens tokens ($gets gets)" "$mib" \
    "$bw_best" "$bw_median" "$ratio"
  printf "%s\t%s\t%s\t%s\t%s\t%s\n" "$tokens" "$mib" "$bw_best" "$bw_median" "$perftest_mibps" \
    "$ratio" >>"$out/netns_kv.tsv"
done
printf "%-32s %10s %12.0f\n" "ucx_perftest ucp_get 32 KiB -O 64" "-" "$perftest_mibps"
printf "%-32s %10s %12.0f\n" "ucx_perftest ucp_get 1 MiB -O 64" "-" "$perftest_peak_mibps"
printf "%-32s %10s %12.0f %12s %8s\n" "ucx_perftest ucp_am_bw 32 KiB" "-" "$perftest_am_mibps" "" \
  "$(awk -v a="$perftest_am_mibps" -v t="$(awk -F'\t' 'NR == 4 {print $6}' "$out/kv_link_bench.tsv")" \
     'BEGIN {printf "%.2f", (a > 0 ? t / a : 0)}')"
printf "perftest_get_32KiB_MiBps\t%s\nperftest_get_1MiB_MiBps\t%s\nperftest_am_bw_32KiB_MiBps\t%s\n" \
  "$perftest_mibps" "$perftest_peak_mibps" "$perftest_am_mibps" >"$out/perftest.tsv"
echo "raw numbers: $out/netns_kv.tsv"
