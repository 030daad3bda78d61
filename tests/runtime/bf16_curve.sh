#!/bin/sh
# bf16_curve.sh APP [app flags...]: bf16 mixed precision trains as fp32 does. 200 steps of
# the default GPT with the reference interpreter (which every pipelined run equals bit for
# bit, --check), in fp32 and in bf16: the 10-step moving average of the bf16 loss stays
# within 2% of fp32's over the whole curve, and the runs differ (bf16 really ran).
set -e
app=$1; shift
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
for p in fp32 bf16; do
  "$app" --reference --precision "$p" --steps 200 --log "$dir/$p.jsonl" "$@" >"$dir/log" 2>&1 ||
    { cat "$dir/log"; echo "FAIL: the $p run failed"; exit 1; }
done
python3 - "$dir/fp32.jsonl" "$dir/bf16.jsonl" <<'PY'
import json, sys
f, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:3])
assert len(f) == len(b) == 200, (len(f), len(b))
avg = lambda x, i: sum(x[i:i + 10]) / 10
worst = max(abs(avg(b, i) - avg(f, i)) / avg(f, i) for i in range(191))
print(f"fp32 {f[0]:.4f} -> {f[-1]:.4f}, bf16 {b[0]:.4f} -> {b[-1]:.4f}; "
      f"worst 10-step average difference {100 * worst:.2f}%")
assert f != b, "bf16 gave fp32's bits: the bf16 path did not run"
assert worst <= 0.02, f"bf16's loss curve is {100 * worst:.2f}% from fp32's (limit 2%)"
assert f[-1] < 0.6 * f[0] and b[-1] < 0.6 * b[0], "the model did not learn"
print("ok")
PY
