#!/bin/bash
# slurm.sh MPIEXEC GPT: starpipe under a real one-node Slurm, as a cluster user launches
# it. Starts its own munged (a fresh key), slurmctld and slurmd as root in a temporary
# folder (its own slurm.conf, free ports, state and spool dirs there), then checks:
#   1. srun --mpi=pmix -n 2 GPT --steps 3 --check trains, every step bitwise equal to the
#      reference;
#   2. srun --mpi=none -n 2 GPT ends within seconds, non-zero, with starpipe's one line
#      naming the cause on each task (not Open MPI's raw abort text, no training);
#   3. an sbatch job (-n 2) whose script runs srun --mpi=pmix and then mpirun inside the
#      allocation, waited for (scontrol), both bitwise equal to the reference;
#   4. the README's requeue pattern: scancel --signal=USR1 stops the job's run at a step
#      boundary (--save-on-signal), the job requeues itself, the requeued run resumes, and
#      the last checkpoint equals an uninterrupted run's byte for byte.
# Everything it started is stopped on every exit path (trap). Exits 77 (skipped) where
# Slurm cannot run here: not root, or no Slurm/munge binaries (scripts/install-deps
# installs them: slurm-wlm, munge).
set -u
mpiexec=$1; gpt=$2
source "$(dirname "$0")/slurm_lib.sh"
slurm_prepare
trap slurm_cleanup EXIT
trap 'exit 1' INT TERM
t0=$(date +%s%N)

# One node named as this host says, at 127.0.0.1.
node=$(hostname -s)
cpus=$(nproc)
over=(); [ "$cpus" -ge 2 ] || over=(--overcommit)
mkdir -p "$dir/tmp" "$dir/spool-$node"
slurm_conf "$node" 127.0.0.1 "$dir/tmp" \
  "NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=100 State=UNKNOWN"
slurm_start slurmctld -D -i -f "$dir/slurm.conf"
slurm_start slurmd -D -N "$node" -f "$dir/slurm.conf"
slurm_wait_idle 1
echo "Slurm up in $(ms "$t0") ms: node $node ($cpus CPUs), slurmctld :$ctld_port, slurmd :$slurmd_port"
timeout 10 srun --mpi=list 2>&1 | grep -qw pmix || fail "srun --mpi=list has no pmix plugin"

bitwise="every step bitwise equal to the reference"
# 1. srun --mpi=pmix: two tasks join one MPI job; --check on every step
t=$(date +%s%N)
run timeout -k 5 90 srun --mpi=pmix -n 2 "${over[@]}" -t 2 "$gpt" --steps 3 --check \
  >"$dir/pmix.out" 2>&1; rc=$?
echo "srun --mpi=pmix -n 2: exit $rc after $(ms "$t") ms"
grep -v '^\[starpu\]' "$dir/pmix.out"
[ $rc -eq 0 ] || fail "srun --mpi=pmix exited $rc"
grep -q "^starpipe-gpt: 2 actors," "$dir/pmix.out" || fail "not 2 actors under srun --mpi=pmix"
[ "$(grep -c '^step [123] .*(= reference)$' "$dir/pmix.out")" -eq 3 ] ||
  fail "not 3 steps equal to the reference"
grep -q "^done: 3 steps .*$bitwise" "$dir/pmix.out" || fail "no '$bitwise'"

# 2. srun without PMIx: starpipe's one line (task 0's, SLURM_PROCID 0, as for any error
# before MPI starts), every task non-zero, promptly
t=$(date +%s%N)
run timeout -k 5 30 srun --mpi=none -n 2 "${over[@]}" -t 1 "$gpt" --steps 3 --check \
  >"$dir/none.out" 2>&1; rc=$?
took=$(ms "$t")
echo "srun --mpi=none -n 2: exit $rc after $took ms"
grep -v '^\[starpu\]' "$dir/none.out"
[ $rc -ne 0 ] || fail "srun --mpi=none exited 0"
[ $rc -ne 124 ] && [ "$took" -lt 15000 ] || fail "srun --mpi=none took $took ms"
want="starpipe-gpt: error: launched as 2 tasks by srun without an MPI plugin (--mpi=none), but Open MPI [0-9.]* starts under srun only through PMIx: srun needs --mpi=pmix (srun --mpi=list shows the plugins)"
n=$(grep -c "^$want" "$dir/none.out")
[ "$n" -eq 1 ] || fail "$n lines named the cause, expected 1 (task 0's)"
grep -q "tasks 0-1: Exited with exit code" "$dir/none.out" || fail "not every task exited non-zero"
# besides srun's own "srun: error: NODE: tasks 0-1: Exited with exit code 1"
[ "$(grep -v '^srun: error: .*Exited with exit code' "$dir/none.out" | grep -c error)" -eq 1 ] ||
  fail "error lines besides starpipe's one and srun's exit codes"
! grep -q -e "direct launched" -e "MPI_Init" -e "^step " "$dir/none.out" ||
  fail "Open MPI's own text or a training step under srun --mpi=none"

# 3. sbatch: a job script running srun --mpi=pmix, then mpirun inside the allocation
cat >"$dir/job.sh" <<EOF
#!/bin/bash
#SBATCH --job-name=starpipe-test
#SBATCH --ntasks=2
#SBATCH --time=2
echo "== batch: \$SLURM_NTASKS tasks on \$SLURM_JOB_NODELIST"
echo "== srun --mpi=pmix"
srun --mpi=pmix "$gpt" --steps 3 --check || exit 11
echo "== mpirun"
"$mpiexec" "$gpt" --steps 3 --check || exit 12
EOF
# (polled here: sbatch --wait polls every few seconds, up to 10)
t=$(date +%s%N)
job=$(run timeout 10 sbatch --parsable "${over[@]}" -o "$dir/job.out" "$dir/job.sh") ||
  fail "sbatch refused the job"
slurm_wait_job "$job"
code=$(echo "$state" | sed -n 's/.* ExitCode=\([0-9]*\):\([0-9]*\).*/\1:\2/p')
echo "sbatch job $job: $(echo "$state" | grep -o 'JobState=[A-Z]*') exit $code after $(ms "$t") ms"
grep -v '^\[starpu\]' "$dir/job.out" 2>/dev/null
[ "$code" = 0:0 ] && [[ $state == *JobState=COMPLETED* ]] || fail "the batch job ended $code"
grep -q "^== batch: 2 tasks on $node" "$dir/job.out" || fail "the job was not 2 tasks on $node"
for how in "srun --mpi=pmix" mpirun; do
  sed -n "/^== $how\$/,/^== /p" "$dir/job.out" | grep -q "^done: 3 steps .*$bitwise" ||
    fail "no '$bitwise' under $how in the batch job"
  sed -n "/^== $how\$/,/^== /p" "$dir/job.out" | grep -q "^starpipe-gpt: 2 actors," ||
    fail "not 2 actors under $how in the batch job"
done

# 4. the README's requeue pattern: a job signalled with SIGUSR1 (as --signal=USR1@120 does
# before its time limit) saves at the next step boundary, exits 0 and requeues itself; the
# requeued job resumes with the same command line, and its last checkpoint is the
# uninterrupted run's, byte for byte. --open-mode=append: the job's output keeps both runs.
small="--layers 2 --channels 16 --heads 2 --context 16 --total-steps 8000"
# shellcheck disable=SC2086
run timeout -k 5 90 srun --mpi=pmix -n 2 "${over[@]}" -t 2 "$gpt" $small \
  --save "$dir/full.st" >"$dir/full.out" 2>&1 || fail "the uninterrupted srun run failed"
cat >"$dir/requeue.sh" <<JOB
#!/bin/bash
#SBATCH --ntasks=2
#SBATCH --time=2
#SBATCH --requeue
#SBATCH --open-mode=append
cd "$dir" || exit 1
resume=""
[ -f ck.st ] && resume="--resume ck.st"
log=run-\$SLURM_JOB_ID.\${SLURM_RESTART_COUNT:-0}.out
srun --mpi=pmix "$gpt" $small --save ck.st --save-on-signal USR1 --log train.log \$resume |
  tee "\$log"
grep -q "stopped by SIGUSR1" "\$log" && scontrol requeue "\$SLURM_JOB_ID"
exit 0
JOB
job=$(run timeout 10 sbatch --parsable "${over[@]}" -o "$dir/requeue.out" "$dir/requeue.sh") ||
  fail "sbatch refused the requeue job"
# Signalled once rank 0 has opened its --log file: every rank has its handler by then (armed
# before MPI starts), and the run is 8000 steps from its end. Not at a "step" line: the
# task's stdout reaches the file through slurmstepd and srun, which under load delivered
# it only as the run ended (the signal came after the last step).
i=0
until [ -e "$dir/train.log" ]; do
  sleep 0.1; i=$((i + 1)); [ $i -lt 600 ] || fail "job $job opened no --log file in 60 s"
done
run timeout 10 scancel --signal=USR1 "$job" || fail "scancel --signal=USR1 failed"
i=0
while :; do
  state=$(timeout 5 scontrol -o show job "$job" 2>/dev/null)
  [[ $state == *JobState=COMPLETED* && $state == *Restarts=1* ]] && break
  [[ $state == *JobState=COMPLETED* && $state == *Restarts=0* ]] &&
    fail "job $job ended without a requeue: the signal came after its last step, or did not stop it"
  # slurmctld holds a requeued job for two minutes (Reason=BeginTime): start it, but not
  # within the second slurmd revoked the first run's credential (a credential made in that
  # same second counts as revoked: "Killing non-startable batch job: Job credential revoked")
  if [[ $state == *JobState=PENDING*Reason=BeginTime* ]]; then
    [ -n "${held:-}" ] || held=$(date +%s%N)
    [ "$(ms "$held")" -lt 2000 ] ||
      run timeout 5 scontrol update jobid="$job" StartTime=now >/dev/null 2>&1
  fi
  case $state in *JobState=FAILED*|*JobState=CANCELLED*|*JobState=TIMEOUT*) fail "job $job: $state" ;; esac
  sleep 0.2; i=$((i + 1)); [ $i -lt 600 ] || fail "requeued job $job not done in 120 s: $state"
done
at=$(sed -n 's/.*stopped by SIGUSR1 after step \([0-9]*\):.*/\1/p' "$dir/run-$job.0.out")
[ -n "$at" ] && [ "$at" -lt 8000 ] || fail "the first run of job $job was not stopped by SIGUSR1"
grep -q "^resumed from ck.st after step $at" "$dir/run-$job.1.out" ||
  fail "the requeued run did not resume after step $at"
grep -q "^done: $((8000 - at)) steps" "$dir/run-$job.1.out" || fail "the requeued run did not finish"
cmp "$dir/full.st" "$dir/ck.st" || fail "stopped at step $at, requeued and resumed: not the uninterrupted run's bytes"
echo "sbatch --requeue job $job: stopped by SIGUSR1 after step $at, requeued, resumed, bytewise the uninterrupted run"
echo "ok: $(srun --version) on one node: srun --mpi=pmix, srun --mpi=none named, sbatch with srun and mpirun, a job stopped by a signal, requeued and resumed; $(ms "$t0") ms"
