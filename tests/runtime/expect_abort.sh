#!/bin/sh
# expect_abort.sh LIMIT_S CMD...: passes when CMD exits non-zero within LIMIT_S seconds
# and says it aborted on purpose; a clean exit, another failure or a slow one fails.
limit=$1; shift
start=$(date +%s%N)
out=$(timeout $((limit + 20)) "$@" 2>&1); rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "$out" | grep -v '^\[starpu\]'
echo "exit code $rc after $ms ms (limit $limit s)"
[ "$rc" -ne 0 ] || { echo "FAIL: exited 0"; exit 1; }
[ "$rc" -ne 124 ] || { echo "FAIL: hung"; exit 1; }
echo "$out" | grep -q "giving up on purpose" || { echo "FAIL: not the planned abort"; exit 1; }
[ "$ms" -lt $((limit * 1000)) ] || { echo "FAIL: too slow"; exit 1; }
echo "ok"
