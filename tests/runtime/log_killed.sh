#!/bin/sh
# log_killed.sh MPIEXEC APP: a run killed mid-way (SIGKILL of rank 0, the rank that writes
# --log, once a few lines are written) leaves a log whose every line is a JSON object with
# the step's fields, steps 1, 2, 3, ... in order. A run resumed from the killed run's last
# checkpoint keeps the lines up to the checkpoint's step, drops the later ones and a
# partial last line, and appends its own steps.
mpiexec=$1; app=$2
command -v python3 >/dev/null || { echo "skipped: no python3 to parse the JSON"; exit 77; }
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
small="--layers 2 --channels 16 --heads 2 --context 16 --batch 2"
tag="log-kill-test-$$"
STARPIPE_KILL_TAG=$tag "$mpiexec" -np 2 --oversubscribe -x STARPIPE_KILL_TAG "$app" $small \
  --steps 100000 --warmup 5 --lr-decay cosine --save "$dir/ck.st" --save-every 3 \
  --log "$dir/run.jsonl" >"$dir/out" 2>&1 &
launcher=$!
i=0
until [ -f "$dir/run.jsonl" ] && [ "$(wc -l < "$dir/run.jsonl")" -ge 8 ]; do
  sleep 0.1; i=$((i + 1))
  [ $i -lt 600 ] || { cat "$dir/out"; echo "FAIL: the log never reached 8 lines"; kill -9 $launcher; exit 1; }
done
victim=$("$(dirname "$0")/rank_pid.sh" "$app" "$tag" 0)
[ -n "$victim" ] || { echo "FAIL: rank 0 not found"; kill -9 $launcher; exit 1; }
kill -9 "$victim"
i=0
while kill -0 $launcher 2>/dev/null; do
  sleep 0.2; i=$((i + 1))
  [ $i -lt 150 ] || { echo "FAIL: still running 30 s after the kill"; kill -9 $launcher; exit 1; }
done
wait $launcher && { echo "FAIL: the killed run exited 0"; exit 1; }

# every line: a JSON object with the step's fields, steps consecutive from `first`
check() { # FILE FIRST: prints the last step
  python3 - "$1" "$2" <<'EOF'
import json, sys
path, step = sys.argv[1], int(sys.argv[2])
keys = {"step", "loss", "lr", "tokens_per_s", "flops_per_s", "mfu", "step_ms", "bubble",
        "plan_bubble", "grad_norm"}
data = open(path, "rb").read()
assert data.endswith(b"\n"), "FAIL: the log does not end with a whole line"
for n, line in enumerate(data.decode("utf-8").splitlines(), 1):
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        sys.exit(f"FAIL: {path}:{n} is not JSON ({e}): {line!r}")
    missing = keys - set(row)
    assert not missing, f"FAIL: {path}:{n} lacks {sorted(missing)}"
    assert "eval_loss" not in row, f"FAIL: {path}:{n}: an eval_loss without an evaluation"
    assert row["step"] == step, f"FAIL: {path}:{n}: step {row['step']}, expected {step}"
    step += 1
print(step - 1)
EOF
}
last=$(check "$dir/run.jsonl" 1) || { echo "$last"; exit 1; }
echo "killed run: $last whole JSON lines"
[ "$last" -ge 8 ] || { echo "FAIL: only $last lines"; exit 1; }

# resume from the last checkpoint (a step that is a multiple of 3, before the kill): the
# lines after it, and a partial line, go; the resumed steps follow
printf '{"step":%d,"loss":' $((last + 1)) >> "$dir/run.jsonl"
"$mpiexec" -np 2 --oversubscribe "$app" $small --load "$dir/ck.st" --steps 2 \
  --log "$dir/run.jsonl" >"$dir/out2" 2>&1 || { cat "$dir/out2"; exit 1; }
k=$(sed -n 's/^resumed from .* after step \([0-9]*\)$/\1/p' "$dir/out2")
[ -n "$k" ] && [ "$k" -le "$last" ] && [ $((k % 3)) -eq 0 ] ||
  { cat "$dir/out2"; echo "FAIL: resumed after step '$k'"; exit 1; }
end=$(check "$dir/run.jsonl" 1) || { echo "$end"; exit 1; }
[ "$end" -eq $((k + 2)) ] || { echo "FAIL: the resumed log ends at step $end, not $((k + 2))"; exit 1; }
echo "ok: $last whole lines after SIGKILL; resumed after step $k, the log runs 1..$end"
