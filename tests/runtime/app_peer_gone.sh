#!/bin/sh
# app_peer_gone.sh MPIEXEC APP: issue 36's seventh defect as a user meets it. Under a
# launcher that leaves ranks running when one dies (--mca orte_abort_on_non_zero_status
# 0), rank 0 of 2 is killed (SIGKILL) once it prints "done:": rank 0 then draws --sample
# bytes alone, and rank 1 waits for it in a collective outside any task (the parameters'
# broadcasts, then the app's all-reduce of who failed). With STARPIPE_STEP_TIMEOUT=3,
# rank 1 must give up naming the collective and the whole job end non-zero within 12 s (4 s, then 3 s for reports, then the abort)
# of the kill, leaving no process behind.
mpiexec=$1; app=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
log=$dir/log
tag="peer-gone-$$"
STARPIPE_KILL_TAG=$tag STARPIPE_STEP_TIMEOUT=3 "$mpiexec" -np 2 --oversubscribe \
  --mca orte_abort_on_non_zero_status 0 -x STARPIPE_KILL_TAG -x STARPIPE_STEP_TIMEOUT \
  "$app" --steps 2 --sample 20000 >"$log" 2>&1 &
launcher=$!
cleanup() { # every process of this run
  kill -9 $launcher 2>/dev/null
  for pid in $(pgrep -f "$app"); do
    tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | grep -q "^STARPIPE_KILL_TAG=$tag$" &&
      kill -9 "$pid"
  done
}
fail() { grep -v '^\[starpu\]' "$log" | tail -n 20; echo "FAIL: $*"; cleanup; exit 1; }
i=0
until grep -q "^done: " "$log"; do
  sleep 0.1; i=$((i + 1))
  [ $i -lt 300 ] || fail "never printed done:"
done
victim=$("$(dirname "$0")/rank_pid.sh" "$app" "$tag" 0)
[ -n "$victim" ] || fail "rank 0 not found"
start=$(date +%s%N)
kill -9 "$victim"
i=0
while kill -0 $launcher 2>/dev/null; do
  sleep 0.1; i=$((i + 1))
  [ $i -lt 200 ] || fail "still running 20 s after rank 0 was killed"
done
wait $launcher; rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
grep -v '^\[starpu\]' "$log" | grep -v "^step\|^pipeline\|^sample\|^done" | head -n 12
echo "launcher exit code $rc, $ms ms after the kill"
left=0
for pid in $(pgrep -f "$app"); do
  tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | grep -q "^STARPIPE_KILL_TAG=$tag$" && left=$((left + 1))
done
[ "$left" -eq 0 ] || fail "$left processes left behind"
[ "$rc" -ne 0 ] || fail "exit code 0"
grep -Eq "^starpipe: rank 1: stalled: .*: in .*(broadcast|all-reduce).* for [0-9.]+ s" "$log" ||
  fail "rank 1 printed no stall line naming the collective"
grep -q "a peer that died or is stuck" "$log" || fail "no error says a peer died or is stuck"
[ "$ms" -lt 12000 ] || fail "took $ms ms"
echo "ok"
