#!/bin/sh
# hang_report.sh MPIEXEC APP: when STARPIPE_STEP_TIMEOUT fires, every rank prints one line
# saying what it last finished and what it waits for. Stage 1's first task of step 2 hangs
# (STARPIPE_FAULT=hang@2:1) on 2 ranks (both transports) and on 3 ranks: rank 1's line
# must name that task as running; each neighbour's must say its next task waits for a
# receive from rank 1, and the run must end non-zero, promptly.
mpiexec=$1; app=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { cat "$dir/err"; echo "FAIL: $*"; exit 1; }
run() { # run NP TRANSPORT
  np=$1
  start=$(date +%s)
  STARPIPE_FAULT=hang@2:1 STARPIPE_STEP_TIMEOUT=2 STARPIPE_TRANSPORT=$2 \
    timeout 60 "$mpiexec" -np "$np" --oversubscribe -x STARPIPE_FAULT -x STARPIPE_STEP_TIMEOUT \
    -x STARPIPE_TRANSPORT "$app" --steps 4 >/dev/null 2>"$dir/err"
  rc=$?
  took=$(( $(date +%s) - start ))
  what="np $np, $2"
  [ "$rc" -ne 0 ] || fail "$what: exited 0"
  [ "$rc" -ne 124 ] || fail "$what: hung"
  [ "$took" -lt 30 ] || fail "$what: took $took s"
  for r in $(seq 0 $((np - 1))); do
    n=$(grep -c "^starpipe: rank $r: stalled: " "$dir/err")
    [ "$n" -eq 1 ] || fail "$what: rank $r printed $n stall lines, not 1"
  done
  grep -Eq "^starpipe: rank 1: stalled: .*; running 'F mb0 s1' \(#1\) for [0-9.]+ s" "$dir/err" ||
    fail "$what: rank 1 does not name its hung task 'F mb0 s1' as running"
  wait_on_1="next in order '[^']*' \(#[0-9]+\) waits for receive #[0-9]+ from rank 1"
  grep -Eq "^starpipe: rank 0: stalled: .*; $wait_on_1" "$dir/err" ||
    fail "$what: rank 0 does not say it waits for a receive from rank 1"
  if [ "$np" -gt 2 ]; then
    grep -Eq "^starpipe: rank 2: stalled: .*; $wait_on_1" "$dir/err" ||
      fail "$what: rank 2 does not say it waits for a receive from rank 1"
  fi
  # (the rank that fired, or a rank it asked: the first to end takes the others with it)
  grep -Eq "no task finished for 2.0 s" "$dir/err" || fail "$what: no watchdog error"
  echo "ok: $what ($took s)"
  grep "stalled" "$dir/err" | cut -c1-220
}
run 2 starpu-mpi
run 2 direct
run 3 starpu-mpi
