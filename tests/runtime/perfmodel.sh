#!/bin/sh
# perfmodel.sh MPIEXEC APP: StarPU sees the stages. After a 2-rank run, StarPU's history
# performance models hold each rank's per-stage task times: one entry with samples per
# model (starpipe_F_r0 and starpipe_BW_r0 for stage 0, ..._r1 for stage 1), keyed by the
# stage and the sizes, and a stage's F and BW keys differ from the other stage's. The home
# starts with a run whose step 2 fails (STARPIPE_FAULT): its failed and drained tasks took
# microseconds and must not land under the stages' keys (the next run's times would
# deviate by orders of magnitude, and StarPU would flush the history and warn on stderr);
# they go to a key of their own (runtime/exec/codelet.c, task_footprint: 0badf00d).
set -e
mpiexec=$1; app=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
# StarPU warns when a time deviates from its entry's mean by more than this (the executor
# sets 1000%): 50x, beyond the jitter of millisecond tasks, far below the 1000x and more
# between such a task and a drained one
export STARPU_HISTORY_MAX_ERROR=5000
run() { # run LOG [VAR=VALUE]: the default GPT on 2 ranks in this StarPU home, under the
  # published 1F1B (fused backwards on both stages: the default splits stage 1's)
  log=$1; shift
  env STARPU_HOME="$dir" "$@" "$mpiexec" -np 2 -x STARPU_HOME -x STARPU_HISTORY_MAX_ERROR \
    ${1:+-x ${1%%=*}} "$app" --steps 3 --schedule 1f1b >"$dir/$log" 2>&1
}
# first, in the fresh home, a run whose step 2 fails, then a run after it
if run fault.log STARPIPE_FAULT=fail@2:1; then
  cat "$dir/fault.log"; echo "FAIL: the injected task failure did not fail the run"; exit 1
fi
run log || { cat "$dir/log"; echo "FAIL: the run after the failed one failed"; exit 1; }
if grep "deviation for model starpipe_[BFW]*_r" "$dir/fault.log" "$dir/log"; then
  echo "FAIL: failed tasks' times reached the stages' history (StarPU flushed it)"; exit 1
fi
key() { # key SYMBOL: the footprint of its one entry with samples
  f=$(find "$dir/.starpu/sampling/codelets" -name "$1.*" | head -1)
  [ -n "$f" ] || { echo "FAIL: no performance model $1" >&2; find "$dir" -type f >&2; exit 1; }
  k=$(awk 'length($1) == 8 && $1 ~ /^[0-9a-f]+$/ && $1 != "0badf00d" && $NF + 0 > 0 { print $1 }' "$f")
  [ "$(echo "$k" | grep -c .)" = 1 ] || { cat "$f" >&2; echo "FAIL: $1: expected one stage entry" >&2; exit 1; }
  echo "$k"
}
f0=$(key starpipe_F_r0); f1=$(key starpipe_F_r1)
b0=$(key starpipe_BW_r0); b1=$(key starpipe_BW_r1)
[ "$f0" != "$f1" ] && [ "$b0" != "$b1" ] || { echo "FAIL: stages share keys ($f0 $f1 $b0 $b1)"; exit 1; }
grep -q "^0badf00d" "$(find "$dir/.starpu/sampling/codelets" -name "starpipe_F_r1.*" | head -1)" ||
  { echo "FAIL: the failed run's tasks were not kept apart (no 0badf00d entry)"; exit 1; }
echo "ok: per-stage task times in StarPU's performance models, failed tasks apart"
