#!/usr/bin/env bash
# hosts_links.sh APPS: links like a cluster's, emulated. On 2 hosts (scripts/hosts), a
# 2-actor pipeline, one rank per host, trains unshaped and then with every host's link
# shaped to 10 Mbit/s each way (tc's tbf on both ends of each veth; scripts/hosts link).
# Each rank counts the bytes it sends to the other host per step (STARPIPE_VERBOSE, equal
# to the plan's); at the link's rate those bytes take at least bytes / rate, so a shaped
# step must take at least that long (the median step), and the unshaped one less than half
# of it (else the bound says nothing here). Both runs write the reference's bytes, and
# each rank says it tuned Open MPI's TCP (eager up to 129 KiB, 1 MiB socket buffers) unless
# the user chose otherwise (a third, unshaped run with mpirun --mca btl_tcp_eager_limit).
# Exit 77 where namespaces cannot be made or the kernel has no tbf.
set -euo pipefail
apps=$1
source "$(dirname "$0")/cluster.sh"
cluster_up 2
fail() { grep -v "^\[starpu\]" "$dir/log" 2>/dev/null | tail -30; echo "FAIL: $*"; exit 1; }
rate_bits=10000000
steps=6
"$apps/starpipe-gpt" --reference --actors 2 --steps $steps --save "$dir/ref.ckpt" \
    >"$dir/log" 2>&1 || fail "the reference failed"

# run NAME TCP_EAGER [MPIRUN ARGS]: the median step in ms (steps 2 on) and the most bytes a
# rank sent across; both ranks must say TCP's eager limit is TCP_EAGER
run() {
    local name=$1 eager=$2
    shift 2
    rm -f "$dir/p.ckpt"
    STARPIPE_VERBOSE=1 timeout 200 "$cluster/mpirun" -np 2 --map-by node -x STARPIPE_VERBOSE "$@" \
        "$apps/starpipe-gpt" --steps $steps --save "$dir/p.ckpt" >"$dir/log" 2>&1 ||
        fail "$name: the run failed"
    [[ $(grep -c "^starpipe: rank [01] on .*MPI: Open MPI .* tuned (.*; tcp eager limit $eager B, socket buffers 1048576 B)$" "$dir/log") == 2 ]] ||
        fail "$name: not both ranks said Open MPI's TCP eager limit is $eager B with 1 MiB socket buffers"
    cmp "$dir/ref.ckpt" "$dir/p.ckpt" || fail "$name: the checkpoint differs from the reference's"
    [[ $(grep -c "messages to other hosts in the last step: [0-9]* bytes (.*); the plan's: [0-9]*$" "$dir/log") == 2 ]] ||
        fail "$name: not both ranks counted, as the plan does, what they sent to the other host"
    median=$(awk '$1 == "step" && $2 > 1 { for (i = 3; i < NF; i++) if ($(i + 1) == "ms") print $i }' \
        "$dir/log" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
    bytes=$(sed -n 's/.*messages to other hosts in the last step: \([0-9]*\) bytes.*/\1/p' "$dir/log" |
        sort -n | tail -1)
    [[ -n $median && -n $bytes && $bytes -gt 0 ]] || fail "$name: no step time or no bytes across"
}

run "user's eager limit" 65536 --mca btl_tcp_eager_limit 65536
run unshaped 132096
free=$median
"$root/scripts/hosts" link "$cluster" $rate_bits || exit $? # 77: no tbf here
run "10 Mbit/s" 132096
bound=$(awk -v b="$bytes" -v r=$rate_bits 'BEGIN { printf "%.1f", 1000 * b * 8 / r }')
echo "unshaped: median step $free ms; at 10 Mbit/s: $median ms; $bytes bytes across per step and direction take $bound ms at that rate"
awk -v m="$median" -v b="$bound" 'BEGIN { exit !(m >= b) }' ||
    fail "at 10 Mbit/s a step took $median ms, less than its bytes across need ($bound ms): the link is not shaped"
awk -v f="$free" -v b="$bound" 'BEGIN { exit !(f < b / 2) }' ||
    fail "unshaped, a step took $free ms, not under half the shaped bound ($bound ms): the bound says nothing here"
echo "ok: a shaped link slows the step to at least its bytes / rate, the counters equal the plan's, the bytes the reference's"
