#!/usr/bin/env bash
# hosts_slurm.sh APPS: Slurm across nodes. A cluster of 2 hosts (scripts/hosts), one
# slurmd on each (its own node name, address and local scratch), slurmctld on this machine
# at the bridge's address, munged's socket shared as a cluster's munge key is. Then:
#   1. sbatch -N 2 --ntasks-per-node 2, whose script runs srun --mpi=pmix and then mpirun
#      inside the allocation, P = 2 x T = 2 (a tensor group on each node): both write the
#      single-process reference's gradients and checkpoint byte for byte, and each rank
#      says the node and the node-local rank Slurm placed it on;
#   2. a node lost in the middle of a job: sbatch --requeue -N 2 --ntasks-per-node 1
#      trains with checkpoints, host 1's link is cut; the rank on node 0 ends within
#      STARPIPE_STEP_TIMEOUT and a few seconds naming the silent host, the job script
#      requeues the job (its run failed after a checkpoint), slurmctld marks node 1 down,
#      and the requeued job, given one node (scontrol update NumNodes=1 NumTasks=1),
#      resumes there and ends with the reference's bytes; no rank is left on either host.
# (One task per node in 2. Each host has a core of its own; two tasks of one node would
# share it.)
# Exit 77 where namespaces cannot be made or Slurm is missing.
set -uo pipefail
apps=$(cd "$1" && pwd)
here=$(dirname "$0")
source "$here/cluster.sh"
source "$here/../slurm/slurm_lib.sh"
trap 'exit 1' INT TERM
# each host a core of its own, as a cluster's nodes have theirs (its slurmd started
# there by scripts/hosts exec, and so its jobs' ranks, confined to it): with every core
# on both hosts, each node's rank took the machine for its own and both bound their
# StarPU-MPI threads to the same core, where the two threads' polling left one of them
# without the core for seconds at a time (steps of 3-5 ms that took up to 33 s, a
# message "sent" and not received within STARPIPE_STEP_TIMEOUT: the stalls this test met
# in CI)
cluster_up 2 1
rmdir "$dir" # (its scratch folder: Slurm's is the one used)
slurm_prepare
trap 'slurm_cleanup; cluster_down' EXIT
t0=$(date +%s%N)
gpt=$apps/starpipe-gpt
net=$(sed -n '1s/\.[0-9]* .*//p' "$cluster/hostfile")
cpus=$(nproc) # Slurm's count per node (room for 2 tasks; they share the host's core)
# a node is down after 30 s of silence (Slurm's default: 300 s), after the ranks' own
# STARPIPE_STEP_TIMEOUT has named it (else slurmstepd cancels them first)
slurmd_timeout=${HOSTS_SLURMD_TIMEOUT:-30} # (less: Slurm's requeue on node failure first)
slurm_conf "$(hostname -s)" "$net.254" "$cluster/local" \
  "NodeName=$name-node0 NodeAddr=$net.1 CPUs=$cpus RealMemory=100 State=UNKNOWN" \
  "NodeName=$name-node1 NodeAddr=$net.2 CPUs=$cpus RealMemory=100 State=UNKNOWN"
slurm_start slurmctld -D -i -f "$dir/slurm.conf"
for i in 0 1; do
  mkdir -p "$dir/spool-$name-node$i"
  slurm_start "$root/scripts/hosts" exec "$cluster" $i slurmd -D -N "$name-node$i" -f "$dir/slurm.conf"
done
slurm_wait_idle 2
echo "Slurm up in $(ms "$t0") ms: nodes $name-node0 and $name-node1 ($cpus CPUs each), slurmctld at $net.254"

# 1. bitwise across nodes, under srun and under mpirun in one allocation
"$gpt" --reference --actors 2 --tensor 2 --steps 2 --dump-grads "$dir/ref.grads" \
  --save "$dir/ref.ckpt" >"$dir/ref.out" 2>&1 || { cat "$dir/ref.out"; fail "the reference failed"; }
cat >"$dir/job.sh" <<EOF
#!/bin/bash
echo "== batch on \$(hostname): \$SLURM_NNODES nodes (\$SLURM_JOB_NODELIST), \$SLURM_NTASKS tasks"
export STARPIPE_VERBOSE=1
echo "== srun --mpi=pmix"
srun --mpi=pmix "$gpt" --tensor 2 --steps 2 --dump-grads "$dir/srun.grads" --save "$dir/srun.ckpt" || exit 11
echo "== mpirun"
mpirun "$gpt" --tensor 2 --steps 2 --dump-grads "$dir/mpirun.grads" --save "$dir/mpirun.ckpt" || exit 12
EOF
t=$(date +%s%N)
job=$(run timeout 10 sbatch --parsable -N 2 --ntasks-per-node 2 -t 3 -o "$dir/job.out" \
  "$dir/job.sh") || fail "sbatch refused the job"
slurm_wait_job "$job" 240
code=$(echo "$state" | sed -n 's/.* ExitCode=\([0-9]*\):\([0-9]*\).*/\1:\2/p')
echo "sbatch -N 2 --ntasks-per-node 2 job $job: $(echo "$state" | grep -o 'JobState=[A-Z]*') exit $code after $(ms "$t") ms"
grep -v '^\[starpu\]\|^step \|^\[starpu_comm' "$dir/job.out"
[ "$code" = 0:0 ] || fail "the job ended $code"
grep -q "^== batch on $name-node0: 2 nodes" "$dir/job.out" || fail "not a 2-node job started on $name-node0"
for how in srun mpirun; do
  cmp "$dir/ref.grads" "$dir/$how.grads" || fail "$how across nodes: gradients differ from the reference"
  cmp "$dir/ref.ckpt" "$dir/$how.ckpt" || fail "$how across nodes: checkpoint differs from the reference"
  part=$(sed -n "/^== $how/,/^== /p" "$dir/job.out")
  for r in 0 1 2 3; do
    grep -q "^starpipe: rank $r on $name-node$((r / 2)) (local $((r % 2)) of 2):" <<<"$part" ||
      fail "$how: rank $r did not say it ran on $name-node$((r / 2)) as local rank $((r % 2)) of 2"
  done
done
echo "srun --mpi=pmix and mpirun across 2 nodes: P=2 x T=2 wrote the reference's bytes"

# 2. a node lost in the middle of a job, the job requeued onto the node left
total=200
model="--layers 4 --channels 16 --heads 2 --context 16 --batch 2 --microbatches 4"
# shellcheck disable=SC2086
"$gpt" --reference --actors 2 $model --total-steps $total --save "$dir/full.st" \
  >"$dir/ref.out" 2>&1 || { cat "$dir/ref.out"; fail "the reference run failed"; }
cat >"$dir/requeue.sh" <<EOF
#!/bin/bash
cd "$dir" || exit 1
resume=""
[ -f ck.st ] && resume="--resume ck.st"
log=run-\$SLURM_JOB_ID.\${SLURM_RESTART_COUNT:-0}.out
echo "== \$SLURM_NNODES nodes, \$SLURM_NTASKS tasks" >"\$log"
STARPIPE_STEP_TIMEOUT=5 srun --mpi=pmix "$gpt" $model --total-steps $total --save ck.st \
  --save-every 10 \$resume >>"\$log" 2>&1
rc=\$?
echo "== srun exit \$rc" >>"\$log"
# a run that failed after a checkpoint: requeue, to resume from it
[ \$rc -ne 0 ] && [ -f ck.st ] && scontrol requeue "\$SLURM_JOB_ID"
exit 0
EOF
job=$(run timeout 10 sbatch --parsable -N 2 --ntasks-per-node 1 -t 3 --requeue \
  -o "$dir/requeue.out" "$dir/requeue.sh") || fail "sbatch refused the requeue job"
i=0
until [ -f "$dir/ck.st" ] && grep -q "^step 2[0-9] " "$dir/run-$job.0.out" 2>/dev/null; do
  sleep 0.1; i=$((i + 1)); [ $i -lt 900 ] || { cat "$dir/run-$job.0.out"; fail "job $job: no checkpoint in 90 s"; }
done
grep -q "^== 2 nodes, 2 tasks" "$dir/run-$job.0.out" || { head -3 "$dir/run-$job.0.out"; fail "job $job did not start on 2 nodes"; }
ip link set "${name}v1" down
cut=$(date +%s%N)
echo "job $job: host 1's link cut after $(grep -c '^step ' "$dir/run-$job.0.out") steps"
# the rank on node 0 ends by its own watchdog, naming node 1, and srun with it; the job
# script requeues the job (its run failed after a checkpoint). slurmctld, hearing nothing
# from node 1's slurmd for SlurmdTimeout (30 s, counted from its last ping, which may
# precede the cut by seconds), marks it down meanwhile, and where that comes before srun
# has ended (srun waits on node 1's step first: 15 s after the cut here, more on a slower
# machine) it kills the job script itself and requeues the job: --requeue's node failure.
# Either way the rank must have ended on its own, naming node 1.
log=$dir/run-$job.0.out
i=0
until grep -q "^srun: error: $name-node0: task 0: Exited with exit code" "$log"; do
  sleep 0.1; i=$((i + 1))
  [ $i -lt 600 ] || { grep -v "^step" "$log"; fail "job $job: the rank on node 0 still runs 60 s after the cut"; }
done
echo "job $job: the rank on node 0 ended $(ms "$cut") ms after the cut, naming the silent host:"
grep "^starpipe: rank 0[: ].*$name-node1" "$log"
grep -q "^starpipe: rank 0[: ].*$name-node1" "$log" || { grep -v "^step" "$log"; fail "the rank on node 0 did not name $name-node1"; }
i=0
until grep -q "^== srun exit" "$log"; do
  state=$(timeout 5 scontrol -o show job "$job" 2>/dev/null)
  [[ $state == *Restarts=[1-9]* ]] && { echo "job $job: node 1 marked down before srun ended; Slurm requeued the job"; break; }
  sleep 0.2; i=$((i + 1))
  [ $i -lt 300 ] || { grep -v "^step" "$log"; fail "job $job: srun on node 0 still runs 60 s after its rank ended"; }
done
grep "^srun\|^== srun" "$log"
! grep -q "^== srun exit 0" "$log" || fail "srun exited 0 after the cut"
i=0
while :; do
  state=$(timeout 5 scontrol -o show job "$job" 2>/dev/null)
  [[ $state == *JobState=COMPLETED* && $state == *Restarts=1* ]] && break
  # requeued and held (Reason=BeginTime): start it on the node left, as its user would,
  # not within the second slurmd revoked the first run's credential (tests/slurm/slurm.sh)
  # (a requeue restores the job's own node count: again if Slurm requeued it once more)
  if [[ $state == *JobState=PENDING* && $state == *Restarts=1* && $state == *NumNodes=2* ]]; then
    [ -n "${held:-}" ] || held=$(date +%s%N)
    if [ "$(ms "$held")" -ge 2000 ]; then
      run timeout 5 scontrol update jobid="$job" NumNodes=1 NumTasks=1 StartTime=now ||
        fail "scontrol update of job $job refused"
      held=
    fi
  fi
  case $state in *JobState=FAILED*|*JobState=CANCELLED*|*JobState=TIMEOUT*|*JobState=COMPLETED*Restarts=0*) fail "job $job: $state" ;; esac
  sleep 0.2; i=$((i + 1)); [ $i -lt 900 ] || fail "job $job not requeued and done in 180 s: $state"
done
echo "job $job: requeued and done $(ms "$cut") ms after the cut"
grep "^== \|^resumed\|^done" "$dir/run-$job.1.out"
grep -q "^== 1 nodes, " "$dir/run-$job.1.out" || fail "the requeued job did not run on the node left"
grep -q "^resumed from ck.st after step" "$dir/run-$job.1.out" || fail "the requeued run did not resume"
cmp "$dir/full.st" "$dir/ck.st" || fail "resumed on the node left: the final checkpoint differs from the reference's"
# nothing of the job left on either host: host 1's rank ends by its own watchdog (within
# 30 s of the cut; where Slurm's requeue came first the job may be done before that)
i=0
while :; do
  left=
  for h in 0 1; do
    for p in $(ip netns pids "${name}h$h" 2>/dev/null); do
      [[ $(cat "/proc/$p/comm" 2>/dev/null) != starpipe-gpt ]] || left="$left pid $p on $name-node$h"
    done
  done
  [ -n "$left" ] || break
  [ "$(ms "$cut")" -lt 30000 ] || fail "a rank still runs 30 s after the cut and after the job:$left"
  sleep 0.2
done
ip link set "${name}v1" up
echo "ok: Slurm across 2 nodes: sbatch -N 2 with srun and mpirun bitwise, a node lost and the job requeued onto the other; $(ms "$t0") ms"
