#!/bin/sh
# expect_fail.sh LIMIT_S PATTERN CMD...: passes when CMD exits non-zero within LIMIT_S
# seconds, prints PATTERN (a grep -E expression) on stderr, and prints exactly one error
# line (one message from one rank, not one per rank; ONE_ERROR=0 skips that count, for
# failures where the launcher adds its own lines). Bad input must never hang.
limit=$1; pattern=$2; shift 2
err=$(mktemp)
start=$(date +%s%N)
timeout $((limit + 20)) "$@" >/dev/null 2>"$err"; rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
grep -v '^\[starpu\]' "$err" | grep -v -- '^---' | grep -v '^ *$' > "$err.clean"
cat "$err.clean"
echo "exit code $rc after $ms ms (limit $limit s)"
fail() { echo "FAIL: $1"; rm -f "$err" "$err.clean"; exit 1; }
[ "$rc" -ne 0 ] || fail "exited 0"
[ "$rc" -ne 124 ] || fail "hung"
[ "$ms" -lt $((limit * 1000)) ] || fail "too slow"
grep -Eq -- "$pattern" "$err.clean" || fail "no message matching '$pattern'"
n=$(grep -c 'error' "$err.clean")
[ "${ONE_ERROR:-1}" = 0 ] || [ "$n" -eq 1 ] || fail "$n error lines, expected exactly one"
rm -f "$err" "$err.clean"
echo "ok"
