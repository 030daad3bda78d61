#!/bin/sh
# kill_rank.sh MPIEXEC APP [NP VICTIM [app flags...]]: rank VICTIM (1) of NP (3) killed
# mid-run (SIGKILL, after step 2 is printed) must make every rank exit non-zero within
# 30 s, with a message naming the dead rank, and leave no process behind.
mpiexec=$1; app=$2; np=${3:-3}; victim_rank=${4:-1}
[ $# -ge 4 ] && shift 4 || shift $#
[ $# -gt 0 ] || set -- --width 256
log=$(mktemp)
tag="kill-test-$$"
STARPIPE_KILL_TAG=$tag "$mpiexec" -np "$np" --oversubscribe -x STARPIPE_KILL_TAG "$app" \
  --steps 100000 "$@" >"$log" 2>&1 &
launcher=$!
i=0
until grep -q "^step 2 " "$log"; do
  sleep 0.2; i=$((i + 1))
  [ $i -lt 300 ] || { cat "$log"; echo "FAIL: never reached step 2"; kill -9 $launcher; exit 1; }
done
victim=$("$(dirname "$0")/rank_pid.sh" "$app" "$tag" "$victim_rank")
[ -n "$victim" ] || { echo "FAIL: rank $victim_rank not found"; kill -9 $launcher; exit 1; }
start=$(date +%s%N)
kill -9 "$victim"
i=0
while kill -0 $launcher 2>/dev/null; do
  sleep 0.2; i=$((i + 1))
  [ $i -lt 150 ] || { echo "FAIL: still running 30 s after the kill"; pkill -9 -f "$app"; exit 1; }
done
wait $launcher; rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
grep -v '^\[starpu\]' "$log" | tail -n 12
echo "launcher exit code $rc, $ms ms after the kill"
left=0
for pid in $(pgrep -f "$app"); do
  tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | grep -q "^STARPIPE_KILL_TAG=$tag$" && left=$((left + 1))
done
rm -f "$log.x"
[ "$rc" -ne 0 ] || { echo "FAIL: exit code 0"; exit 1; }
[ "$left" -eq 0 ] || { echo "FAIL: $left processes left behind"; pkill -9 -f "$app"; exit 1; }
v=$victim_rank
grep -Eq "rank $v|rank \[\[.*\],$v\]|process rank $v" "$log" || { echo "FAIL: no message names rank $v"; exit 1; }
rm -f "$log"
echo "ok"
