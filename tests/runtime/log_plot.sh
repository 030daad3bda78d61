#!/bin/sh
# log_plot.sh MPIEXEC APP PLOT: a real run's --log (JSON lines) drawn by scripts/plot-log
# (PLOT): a PNG of the stated 1000 x 700 pixels, of a plausible size, not blank, with the
# loss curve drawn in the top panel and the throughput in the bottom one; and a log with
# a broken line refused with its line number. Skipped (77) without matplotlib.
set -e
mpiexec=$1; app=$2; plot=$3
python3 -c "import matplotlib" 2>/dev/null ||
  { echo "skipped: python3 with matplotlib is not installed (pip install matplotlib)"; exit 77; }
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
"$mpiexec" -np 2 --oversubscribe "$app" --layers 2 --channels 16 --heads 2 --context 16 \
  --batch 2 --steps 12 --warmup 3 --lr-decay cosine --log "$dir/run.jsonl" >"$dir/out" 2>&1 ||
  { cat "$dir/out"; exit 1; }
[ "$(wc -l < "$dir/run.jsonl")" -eq 12 ] || { cat "$dir/run.jsonl"; echo "FAIL: not 12 lines"; exit 1; }
python3 "$plot" "$dir/run.jsonl" -o "$dir/run.png"
python3 - "$dir/run.png" <<'EOF'
import struct, sys
import matplotlib.image as mpimg
import numpy as np
path = sys.argv[1]
data = open(path, "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "FAIL: not a PNG"
w, h = struct.unpack(">II", data[16:24])
assert (w, h) == (1000, 700), f"FAIL: {w} x {h} pixels, not 1000 x 700"
assert 10_000 < len(data) < 2_000_000, f"FAIL: {len(data)} bytes"
rgb = mpimg.imread(path)[..., :3]          # floats in [0, 1], rows from the top
assert rgb.shape[:2] == (700, 1000), rgb.shape
def ink(part, color):
    """pixels of a matplotlib colour (line centres keep it exactly, up to 8-bit rounding)"""
    return int((np.abs(part - np.array(color) / 255.0) < 0.02).all(axis=-1).sum())
top, bottom = rgb[:350], rgb[350:]
for name, part in (("whole", rgb), ("top", top), ("bottom", bottom)):
    assert part.std() > 0.05, f"FAIL: the {name} of the picture is blank (std {part.std():.4f})"
blue, green = ink(top, (31, 119, 180)), ink(bottom, (44, 160, 44))   # tab:blue, tab:green
assert blue > 200, f"FAIL: no loss curve in the top panel ({blue} pixels)"
assert green > 200, f"FAIL: no throughput curve in the bottom panel ({green} pixels)"
print(f"ok: {w} x {h} PNG, {len(data)} bytes, std {rgb.std():.3f}, loss {blue} px, throughput {green} px")
EOF
# a broken line: refused, naming it
head -n 3 "$dir/run.jsonl" > "$dir/bad.jsonl"
echo '{"step":4,"loss":' >> "$dir/bad.jsonl"
if python3 "$plot" "$dir/bad.jsonl" -o "$dir/bad.png" 2>"$dir/err"; then
  echo "FAIL: a broken log was drawn"; exit 1
fi
grep -q "bad.jsonl:4: not a JSON line" "$dir/err" || { cat "$dir/err"; echo "FAIL: unclear message"; exit 1; }
echo "ok: the log of a real run plots; a broken log is refused"
