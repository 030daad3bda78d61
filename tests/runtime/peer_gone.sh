#!/bin/sh
# peer_gone.sh MPIEXEC TEST_PEER_GONE: rank 0 of 2 kills itself while rank 1 waits in a
# collective outside any task, under a launcher that leaves rank 1 running
# (--mca orte_abort_on_non_zero_status 0): for each collective (test_peer_gone.c's modes,
# run side by side: they mostly wait), rank 1 must give up naming it, within 10 s, and
# the whole job must end non-zero with no process left behind.
mpiexec=$1; exe=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
tag="peer-gone-$$"
modes="agreement allreduce gather bcast shutdown"
for m in $modes; do
  (start=$(date +%s%N)
   STARPIPE_PEER_TAG=$tag timeout -s KILL 25 "$mpiexec" -np 2 --oversubscribe \
     --mca orte_abort_on_non_zero_status 0 -x STARPIPE_PEER_TAG "$exe" "$m" >"$dir/$m" 2>&1
   echo "$? $(( ($(date +%s%N) - start) / 1000000 ))" >"$dir/$m.rc") &
done
wait
left=0
for pid in $(pgrep -f "$exe"); do
  tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | grep -q "^STARPIPE_PEER_TAG=$tag$" &&
    { left=$((left + 1)); kill -9 "$pid"; }
done
fail=0
for m in $modes; do
  read -r rc ms <"$dir/$m.rc"
  grep -E "^(starpipe|rank)" "$dir/$m"
  echo "$m: launcher exit code $rc after $ms ms"
  bad=""
  [ "$rc" -ne 0 ] || bad="exited 0"
  [ "$rc" -ne 137 ] || [ "$ms" -lt 25000 ] || bad="hung (killed after 25 s)"
  [ -n "$bad" ] || grep -q "giving up on purpose" "$dir/$m" || bad="rank 1 did not give up as planned"
  [ -n "$bad" ] || grep -q "^starpipe: rank 1: stalled: .* in .* for [0-9.]* s" "$dir/$m" ||
    bad="no stall line from rank 1"
  [ -n "$bad" ] || [ "$ms" -lt 10000 ] || bad="took $ms ms"
  [ -z "$bad" ] || { echo "FAIL: $m: $bad"; fail=1; }
done
[ "$left" -eq 0 ] || { echo "FAIL: $left processes left behind"; fail=1; }
[ "$fail" -eq 0 ] && echo "ok"
exit $fail
