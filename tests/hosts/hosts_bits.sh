#!/usr/bin/env bash
# hosts_bits.sh APPS: bitwise across hosts. A cluster of 3 hosts on this machine
# (scripts/hosts: a network, UTS and mount namespace each, TCP between them) runs
#   - P = 2 x T = 2 on 2 hosts x 2 ranks, each tensor group inside a host, with
#     scatter-gather (the default there) and without (STARPIPE_SCATTER_GATHER=0);
#   - R = 4 x P = 1 on 2 hosts x 2 ranks, the replicas' all-reduce hierarchical (the
#     default there) and flat (STARPIPE_ALLREDUCE=flat), half the bytes across hosts;
#   - R = 2 x P = 2 on 2 hosts x 2 ranks, both rank orders (a host holds a replica's
#     pipeline, or one actor of both replicas);
#   - a 3-host pipeline under interleaved 1F1B, one rank per host;
# each writing the first step's gradients and the checkpoint after two steps, compared
# byte for byte with the single-process reference's. Each rank must say the host and the
# node-local rank it was placed on, and the pipeline's messages (or the replicas'
# all-reduce) must have crossed the hosts' links: the veths' byte counters grew by at
# least what the ranks sent across, and each rank's per-link counters of the last step
# (STARPIPE_VERBOSE) equal the plan's. Exit 77 where namespaces cannot be made.
set -euo pipefail
apps=$1
source "$(dirname "$0")/cluster.sh"
cluster_up 3
fail() { cat "$dir/log"; echo "FAIL: $*"; exit 1; }

link_bytes() { # bytes through every host's veth so far (each counted on the bridge side)
    local n=0
    for i in 0 1 2; do
        n=$((n + $(cat "/sys/class/net/${name}v$i/statistics/tx_bytes") +
                 $(cat "/sys/class/net/${name}v$i/statistics/rx_bytes")))
    done
    echo "$n"
}

# case: what | reference flags | mpirun flags | app flags | rank i's host, by rank |
# whether every pipeline message crosses hosts
run_case() {
    local what=$1 ref=$2 mpi=$3 flags=$4 hosts=$5 crosses=$6
    rm -f "$dir"/*.grads "$dir"/*.ckpt
    # shellcheck disable=SC2086
    "$apps/starpipe-gpt" --reference $ref --steps 2 --dump-grads "$dir/ref.grads" \
        --save "$dir/ref.ckpt" $flags >"$dir/log" 2>&1 || fail "$what: the reference failed"
    local before after
    before=$(link_bytes)
    # shellcheck disable=SC2086
    STARPIPE_VERBOSE=1 timeout 300 "$cluster/mpirun" $mpi -x STARPIPE_VERBOSE \
        ${STARPIPE_SCATTER_GATHER:+-x STARPIPE_SCATTER_GATHER} ${STARPIPE_ALLREDUCE:+-x STARPIPE_ALLREDUCE} \
        "$apps/starpipe-gpt" --steps 2 --dump-grads "$dir/p.grads" --save "$dir/p.ckpt" \
        $flags >"$dir/log" 2>&1 || fail "$what: the run across hosts failed"
    after=$(link_bytes)
    cmp "$dir/ref.grads" "$dir/p.grads" || fail "$what: gradients differ from the reference"
    cmp "$dir/ref.ckpt" "$dir/p.ckpt" || fail "$what: checkpoint differs from the reference"
    # placement: "rank R on HOST (local L of N)", as the hosts list says
    local r=0 h
    for h in $hosts; do
        local per
        per=$(tr ' ' '\n' <<<"$hosts" | grep -c "^$h$")
        local l
        l=$(tr ' ' '\n' <<<"$hosts" | head -$((r + 1)) | grep -c "^$h$")
        grep -q "^starpipe: rank $r on $name-node$h (local $((l - 1)) of $per):" "$dir/log" ||
            fail "$what: rank $r did not say it ran on $name-node$h as local rank $((l - 1)) of $per"
        r=$((r + 1))
    done
    # every pipeline message crossed hosts (crosses=1): each went through two veths
    local sent
    sent=$(grep -o 'transfers over [^:]*: [0-9]* sends ([0-9]* bytes)' "$dir/log" |
        sed 's/.*(\([0-9]*\) bytes)/\1/' | awk '{ n += $1 } END { printf "%d", n }')
    # the per-link counters: each rank's bytes to other hosts in the last step, the plan's
    local links
    links=$(grep -Ec "^starpipe: rank [0-9]*: messages to other hosts in the last step: [0-9]* bytes \(.*\); the plan's: [0-9]*(; boundary tensors scatter-gathered)?$" "$dir/log" || true)
    [[ $links == $(wc -w <<<"$hosts") ]] ||
        fail "$what: $links ranks said what they sent to other hosts, as the plan does, not $(wc -w <<<"$hosts")"
    across=$(sed -n "s/.*messages to other hosts in the last step: \([0-9]*\) bytes.*/\1/p" "$dir/log" |
        awk '{ n += $1 } END { printf "%d", n }')
    [[ $crosses == 0 || $across -gt 0 ]] || fail "$what: no message crossed hosts in the last step"
    echo "$what: $((after - before)) bytes through the hosts' links, $sent sent between actors ($across across hosts in the last step, the plan's)"
    [[ $crosses == 0 || $((after - before)) -ge $((2 * sent)) ]] ||
        fail "$what: $((after - before)) bytes through the links, less than twice the $sent bytes the pipeline sent across"
}

# P = 2 x T = 2: scatter-gather by default (each tensor group inside a host, the boundary
# tensors between hosts as 1/T per member), then without it: fewer bytes across hosts,
# by at most half (the tied weight's messages are split by the vocabulary, not chunked)
run_case "P=2 x T=2" "--actors 2 --tensor 2" "-np 4" "--tensor 2" "0 0 1 1" 1
[[ $(grep -c "boundary tensors scatter-gathered$" "$dir/log") == 4 ]] ||
    fail "P=2 x T=2: not every rank scatter-gathered the boundary tensors between hosts"
sg=$across
STARPIPE_SCATTER_GATHER=0 run_case "P=2 x T=2, whole boundary tensors" "--actors 2 --tensor 2" \
    "-np 4" "--tensor 2" "0 0 1 1" 1
! grep -q "scatter-gathered" "$dir/log" || fail "STARPIPE_SCATTER_GATHER=0 scatter-gathered"
[[ $sg -lt $across && $((2 * (across - sg))) -le $across ]] ||
    fail "P=2 x T=2: $sg bytes across hosts with scatter-gather, $across without"
echo "P=2 x T=2: $sg bytes across hosts in a step with scatter-gather, $across without"
# R = 4 x P = 1, two replicas a host: the replicas' all-reduce hierarchical by default
# (inside each host, one message of each shard across, inside again), then flat (the
# all-to-all of shards): half the bytes across hosts, the same bits
run_case "R=4, hierarchical all-reduce" "--actors 1 --replicas 4" "-np 4" "--replicas 4" "0 0 1 1" 1
hier=$across
STARPIPE_ALLREDUCE=flat run_case "R=4, flat all-reduce" "--actors 1 --replicas 4" "-np 4" \
    "--replicas 4" "0 0 1 1" 1
[[ $((2 * hier)) == "$across" ]] ||
    fail "R=4 on 2 hosts: $hier bytes across hosts hierarchical, $across flat (not twice)"
echo "R=4 on 2 hosts: $hier bytes across hosts in a step hierarchical, $across flat"
run_case "R=2 x P=2, pipeline-major" "--actors 2 --replicas 2" "-np 4" "--replicas 2" "0 0 1 1" 0
run_case "R=2 x P=2, replica-major" "--actors 2 --replicas 2" "-np 4" \
    "--replicas 2 --rank-order replica" "0 0 1 1" 1
run_case "3 hosts, interleaved 1F1B" \
    "--actors 3 --schedule interleaved-1f1b --chunks 2 --layers 6 --microbatches 6" \
    "-np 3 --map-by node" "--schedule interleaved-1f1b --chunks 2 --layers 6 --microbatches 6" \
    "0 1 2" 1
# nothing but the network joins the hosts: without TCP, ranks of two hosts cannot reach
# each other, and the run must end at once, non-zero (Open MPI says so)
t0=$(date +%s)
rc=0
STARPIPE_STEP_TIMEOUT=5 HOSTS_BTL=self,vader timeout 120 "$cluster/mpirun" -np 4 \
    -x STARPIPE_STEP_TIMEOUT "$apps/starpipe-gpt" --tensor 2 --steps 1 >"$dir/log" 2>&1 || rc=$?
[[ $rc != 0 && $rc != 124 ]] || fail "without TCP between the hosts: exit $rc (124: a hang)"
grep -q "unable to reach each other\|did not end in 5.0 s" "$dir/log" ||
    fail "without TCP between the hosts: nothing said the ranks could not reach each other"
echo "without TCP: every rank gone in $(($(date +%s) - t0)) s (exit $rc)"
# a rank of host 1 that never starts: the others wait in MPI's start-up (Open MPI 4 waits
# forever), and STARPIPE_STEP_TIMEOUT ends every rank there, each saying so
t0=$(date +%s)
rc=0
STARPIPE_STEP_TIMEOUT=3 STARPIPE_FAULT=late@3 timeout 120 "$cluster/mpirun" -np 4 \
    -x STARPIPE_STEP_TIMEOUT -x STARPIPE_FAULT "$apps/starpipe-gpt" --tensor 2 --steps 1 \
    >"$dir/log" 2>&1 || rc=$?
[[ $rc != 0 && $rc != 124 ]] || fail "a rank that never starts: exit $rc (124: a hang)"
grep -q "on $name-node[01]: the start-up (MPI, StarPU-MPI) did not end in 3.0 s" "$dir/log" ||
    fail "a rank that never starts: no rank said its start-up did not end"
echo "a rank that never starts: every rank gone in $(($(date +%s) - t0)) s (exit $rc), the start-up named"
echo "ok: across 2 and 3 hosts (TCP between them), every layout wrote the reference's bytes"
