# Sourced by the hardening scripts (app_case.sh, round3.sh), after they set $dir (their
# scratch folder) and $case. fail MSG: the command's output, then "FAIL: case: MSG", exit 1.
# refused LIMIT_S PATTERN CMD...: CMD must exit non-zero within LIMIT_S, print a message
# matching PATTERN on stderr as exactly one error line (one rank speaks), and run no step.
fail() {
  [ -f "$dir/out" ] && tail -n 40 "$dir/out"
  [ -f "$dir/err" ] && cat "$dir/err"
  echo "FAIL: $case: $*"
  exit 1
}

refused() {
  limit=$1 pattern=$2; shift 2
  start=$(date +%s)
  timeout $((limit + 20)) "$@" >"$dir/out" 2>"$dir/err.raw"; rc=$?
  took=$(( $(date +%s) - start ))
  grep -v '^\[starpu\]' "$dir/err.raw" | grep -v -- '^---' | grep -v '^ *$' >"$dir/err"
  [ "$rc" -ne 0 ] || fail "exited 0: $*"
  [ "$rc" -ne 124 ] || fail "hung: $*"
  [ "$took" -le "$limit" ] || fail "took $took s (limit $limit s)"
  grep -Eq -- "$pattern" "$dir/err" || fail "no message matching '$pattern'"
  n=$(grep -c 'error' "$dir/err")
  [ "$n" -eq 1 ] || fail "$n error lines, expected exactly one"
  ! grep -q '^step ' "$dir/out" || fail "a step ran before the refusal"
  echo "ok: $case: $(grep error "$dir/err" | cut -c1-200)"
}
