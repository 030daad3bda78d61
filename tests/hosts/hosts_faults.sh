#!/usr/bin/env bash
# hosts_faults.sh APPS: faults between hosts. On a cluster of 2 hosts x 2 ranks
# (scripts/hosts), a 4-actor pipeline trains under STARPIPE_STEP_TIMEOUT=5, saving every
# 20 steps; once a checkpoint exists, host 1
#   cut:    loses its link (ip link set ... down, in the middle of a step),
#   killed: has every process killed (SIGKILL),
#   frozen: has every process stopped (SIGSTOP), and is thawed once the job has ended.
# Then host 0's ranks must end within the timeout, the reports' grace and a few seconds
# (cut, frozen: each saying in one line that the ranks of host 1 did not answer, naming the
# host; killed: Open MPI's launcher ends the job at once, in its own words), the job within
# a minute (cut: once TCP gives up on host 1); no process may be left on either host
# (frozen: once thawed); the last checkpoint must be intact: the run resumes from it on
# host 0 alone (2 ranks: another layout) and ends with the bytes of the reference run of
# the same steps. Exit 77 where namespaces cannot be made.
set -euo pipefail
apps=$1
source "$(dirname "$0")/cluster.sh"
cluster_up 2
fail() { grep -v "^step \|^\[starpu\]" "$dir/log" 2>/dev/null | tail -60; echo "FAIL: $*"; exit 1; }
host0=$(sed -n 1p "$cluster/hostfile" | cut -d' ' -f1)
model="--layers 4 --channels 16 --heads 2 --context 16 --batch 2 --microbatches 4"
total=3000
job_pids() { # what runs on host $1, its keeper aside (scripts/hosts: the host itself)
    ip netns pids "${name}h$1" 2>/dev/null | grep -vx "$(cat "$cluster/keeper$1")" || true
}
pids_on() { job_pids "$1" | wc -l; }
ranks_on() { # the app's processes on host $1
    local p n=0
    for p in $(ip netns pids "${name}h$1" 2>/dev/null); do
        [[ $(cat "/proc/$p/comm" 2>/dev/null) == starpipe-gpt ]] && n=$((n + 1))
    done
    echo "$n"
}
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

fault_case() {
    local fault=$1 t0 ended rc=0
    rm -f "$dir"/run.st* "$dir"/final.st
    # shellcheck disable=SC2086
    STARPIPE_STEP_TIMEOUT=5 timeout 200 "$cluster/mpirun" -np 4 -x STARPIPE_STEP_TIMEOUT \
        "$apps/starpipe-gpt" $model --total-steps $total --save "$dir/run.st" \
        --save-every 20 >"$dir/log" 2>&1 &
    local job=$!
    for ((i = 0; i < 600; i++)); do [[ -f $dir/run.st ]] && break; sleep 0.05; done
    [[ -f $dir/run.st ]] || fail "$fault: no checkpoint after 30 s"
    t0=$(date +%s.%N)
    case $fault in
    cut) ip link set "${name}v1" down ;;
    killed) kill -KILL $(job_pids 1) ;;
    frozen) kill -STOP $(job_pids 1) ;;
    esac
    # host 0's ranks end within the timeout (5 s), the reports' grace (5 s), the second
    # before the abort and a few seconds (11-12 s measured), or where the fault came
    # between the step's last barrier and StarPU-MPI's drain, the drain's deadline (the
    # timeout, a second, a grace) and a grace for the reports (16 s): by their own watchdog
    # (cut, frozen) or by the launcher (killed)
    for ((i = 0; i < 300; i++)); do [[ $(ranks_on 0) == 0 ]] && break; sleep 0.1; done
    local gone
    gone=$(since "$t0")
    [[ $(ranks_on 0) == 0 ]] || fail "$fault: host 0's ranks still run 30 s after the fault"
    awk -v e="$gone" 'BEGIN { exit !(e <= 25) }' ||
        fail "$fault: host 0's ranks ended $gone s after the fault (STARPIPE_STEP_TIMEOUT=5)"
    # a frozen host thaws (or is fenced) only after the others gave up
    [[ $fault != frozen ]] || kill -CONT $(job_pids 1) 2>/dev/null || true
    wait $job || rc=$?
    ended=$(since "$t0")
    [[ $rc != 0 && $rc != 124 ]] || fail "$fault: the job's exit $rc (124: it hung)"
    awk -v e="$ended" 'BEGIN { exit !(e <= 60) }' ||
        fail "$fault: the job ended $ended s after the fault"
    grep -q '^step 1 ' "$dir/log" || fail "$fault: no step ran"
    if [[ $fault == killed ]]; then
        # Open MPI's launcher ends the job within a second of losing a host's daemon, with
        # its own words (naming the host's address, or only that a daemon is gone), before
        # any rank's watchdog could speak
        grep -q "Peer host: *${host0%.1}.2\|Remote daemon: .* on node ${host0%.1}.2\|unable to reliably start one or more daemons" \
            "$dir/log" || fail "$fault: the launcher did not say it lost a host's daemon"
    else
        # each of host 0's ranks whose last line reached the launcher (Open MPI's output
        # forwarding may lose one in the abort: "ORTE_ERROR_LOG: Out of resource in
        # show_help.c") names host 1, all of whose ranks were silent
        local said
        said=$(grep -c "^starpipe: rank [01][: ].*no report from rank .*2, 3 on $name-node1 (all its ranks)" \
            "$dir/log" || true)
        [[ $said -ge 1 ]] || fail "$fault: no rank of host 0 named host $name-node1 as silent"
        [[ $(grep -c "^starpipe: rank [01][: ].*no report from rank" "$dir/log") == "$said" ]] ||
            fail "$fault: a rank's last line did not name host $name-node1"
    fi
    for ((i = 0; i < 600 && $(pids_on 0) + $(pids_on 1) > 0; i++)); do sleep 0.1; done
    [[ $(pids_on 0) == 0 && $(pids_on 1) == 0 ]] ||
        fail "$fault: processes left 60 s after the job: host 0 $(pids_on 0), host 1 $(pids_on 1)"
    local clean
    clean=$(since "$t0")
    [[ $fault != cut ]] || ip link set "${name}v1" up
    # the last checkpoint resumes on host 0 alone, 2 ranks, to the reference's bytes
    local after
    # shellcheck disable=SC2086
    timeout 200 "$cluster/mpirun" -np 2 -host "$host0:2" "$apps/starpipe-gpt" $model \
        --total-steps $total --save "$dir/final.st" --resume "$dir/run.st" >"$dir/log" 2>&1 ||
        fail "$fault: the resume on host 0 failed"
    after=$(sed -n 's/^resumed from .* after step \([0-9]*\)$/\1/p' "$dir/log")
    [[ -n $after ]] || fail "$fault: the resumed run did not say from which step"
    cmp "$dir/ref.st" "$dir/final.st" ||
        fail "$fault: resumed after step $after on 2 ranks, the final checkpoint differs from the reference's"
    echo "$fault: host 0's ranks gone $gone s after the fault, the job $ended s, every process $clean s; resumed after step $after on host 0 alone: the reference's bytes"
}

# shellcheck disable=SC2086
"$apps/starpipe-gpt" --reference --actors 4 $model --total-steps $total --save "$dir/ref.st" \
    >"$dir/log" 2>&1 || fail "the reference run failed"
for fault in ${HOSTS_FAULTS:-cut killed frozen}; do fault_case "$fault"; done
echo "ok: a host cut off, killed or frozen: the job ends, says which host, leaves nothing; the run resumes on the other"
