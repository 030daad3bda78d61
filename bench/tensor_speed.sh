#!/bin/sh
# tensor_speed.sh [BUILD] [ROUNDS]: the speed-up of tensor parallelism on this machine
# (issue 24, item 7): the large GPT (--layers 8 --channels 256 --context 128) on one
# rank against `mpirun -np 2 ... --tensor 2` (one stage, two ranks of one core each),
# alternated ROUNDS times (default 5), each run's median step time (steps 2..N from the
# app's own lines), then a table: per round both times and their ratio, and the medians.
# Also each rank's memory with STARPIPE_VERBOSE=1 at T = 1, 2 (and 4 with 4 ranks on
# the cores there are), the trainer's own count of its persistent (parameters, gradients,
# AdamW moments, inputs) and per-microbatch buffers.
set -eu
build=${1:-build}; rounds=${2:-5}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
gpt=$build/apps/starpipe-gpt
big="--layers 8 --channels 256 --context 128 --steps 8"
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
# median of the "NN.N ms" of step lines 2..N
med() { grep -E '^step [0-9]+ ' "$1" | tail -n +2 | sed -E 's/.* ([0-9.]+) ms( .*)?$/\1/' |
        sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
echo "| round | 1 rank (ms/step) | 2 ranks, --tensor 2 (ms/step) | speed-up |"
echo "| --- | --- | --- | --- |"
: >"$dir/ratios"
for r in $(seq 1 "$rounds"); do
  "$gpt" $big >"$dir/one" 2>&1
  mpirun -np 2 "$gpt" --tensor 2 $big >"$dir/two" 2>&1
  a=$(med "$dir/one"); b=$(med "$dir/two")
  x=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a / b }')
  echo "$x" >>"$dir/ratios"
  echo "| $r | $a | $b | ${x}x |"
done
echo
echo "median speed-up: $(sort -n "$dir/ratios" | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')x"
echo
echo "| T | ranks | per rank: persistent buffers | per-microbatch buffers at their peak |"
echo "| --- | --- | --- | --- |"
for T in 1 2 4; do
  STARPIPE_VERBOSE=1 mpirun -np "$T" --oversubscribe "$gpt" --tensor "$T" --layers 8 --channels 256 \
    --context 128 --steps 1 >"$dir/mem" 2>&1
  p=$(grep -m1 -E "persistent buffers" "$dir/mem" | sed -E 's/.*persistent buffers ([0-9.]+ MiB).*/\1/')
  q=$(grep -m1 -E "per-microbatch buffers" "$dir/mem" | sed -E 's/.*per-microbatch buffers ([0-9.]+ MiB).*/\1/')
  echo "| $T | $T | $p | $q |"
done
