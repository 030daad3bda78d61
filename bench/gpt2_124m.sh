#!/usr/bin/env bash
# bench/gpt2_124m.sh [BUILD] [STEPS] [OUT]: GPT-2 124M (`--model gpt2`: 12 layers, 12
# heads, 768 channels, vocabulary 50257, context 1024 cut to 256 here) trained on subword
# tokens, pipelined over 2 ranks: the README's example, end to end on one machine.
#  1. a corpus: the Python standard library's sources on this machine (4.7 MB on Debian 12);
#  2. scripts/make-shards --bpe 50257 learns a byte-level BPE from it (it stops where the
#     text has no more pairs to merge) and writes uint16 shards, 64K tokens held out;
#  3. mpirun -np 2 starpipe-gpt --model gpt2, context 256, 8 microbatches of one sequence,
#     lr 6e-4 after 10 warmup steps, STEPS steps (40), --log, then a 32-token sample
#     through the tokenizer; the peak resident memory of each rank polled from /proc;
#  4. scripts/plot-log draws OUT/gpt2-124m.png when matplotlib is there.
# Needs Hugging Face's tokenizers (pip install tokenizers). Prints the run's lines that
# bench/README.md and the README quote; everything lands in OUT (default a new temporary
# directory, kept).
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-40}
OUT=${3:-$(mktemp -d /tmp/gpt2-124m.XXXXXX)}
root=$(cd "$(dirname "$0")/.." && pwd)
APP=$BUILD/apps/starpipe-gpt
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$OUT"
py=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
cat "$py"/*.py >"$OUT/corpus.txt"
echo "corpus: $(wc -c <"$OUT/corpus.txt") bytes of $py/*.py"
"$root/scripts/make-shards" "$OUT/corpus.txt" "$OUT/py" --bpe 50257 --val-tokens 65536 >/dev/null
grep -o '"vocab"' "$OUT/py_tokenizer.json" >/dev/null
cmd=(mpirun -np 2 "$APP" --model gpt2 --context 256 --batch 1 --microbatches 8
     --data "$OUT/py_train_*.bin" --steps "$STEPS" --lr 6e-4 --warmup 10
     --log "$OUT/gpt2-124m.jsonl" --sample 32 --tokenizer "$OUT/py_tokenizer.json")
echo "run: ${cmd[*]}"
STARPIPE_VERBOSE=1 "${cmd[@]}" >"$OUT/run.log" 2>&1 &
pid=$!
exe=$(readlink -f "$APP")
declare -A hwm=()
while kill -0 "$pid" 2>/dev/null; do
    for p in $(pgrep -f starpipe-gpt || true); do # the app's processes, not mpirun's
        [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$exe" ] || continue
        v=$(awk '/^VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null || true)
        [ -n "$v" ] && ((v > ${hwm[$p]:-0})) && hwm[$p]=$v
    done
    sleep 1
done
wait "$pid" || { cat "$OUT/run.log"; echo "gpt2_124m.sh: the run failed" >&2; exit 1; }
grep -E '^(starpipe-gpt|GPT|throughput|cut|plan|  actor|done|pipeline|step (1|2|10|20|30|40|50|60|80|100) )' \
    "$OUT/run.log" || true
grep -E 'persistent buffers' "$OUT/run.log" | sed 's/.*rank \([0-9]\).*persistent buffers \([0-9.]* MiB\).*host memory \([0-9.]* MiB\).*/rank \1: persistent \2, host memory counted \3/' || true
for p in "${!hwm[@]}"; do echo "peak resident memory: process $p $((hwm[$p] / 1024)) MiB"; done
sed -n '/^sample (/,$p' "$OUT/run.log"
awk '/^step [0-9]+ / && $2 > 1 { for (i = 1; i < NF; i++) if ($(i + 1) == "ms") print $i }' \
    "$OUT/run.log" | sort -g | awk '{ v[n++] = $1 } END { if (n) print "median step (steps 2..): " v[int((n - 1) / 2)] " ms" }'
if python3 -c 'import matplotlib' 2>/dev/null; then
    "$root/scripts/plot-log" "$OUT/gpt2-124m.jsonl" -o "$OUT/gpt2-124m.png" && echo "picture: $OUT/gpt2-124m.png"
fi
echo "out: $OUT"
