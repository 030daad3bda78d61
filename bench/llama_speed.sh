#!/bin/sh
# llama_speed.sh [BUILD] [ROUNDS]: the Llama's kernels next to the GPT's on this machine
# (issue 26): the large config (--layers 8 --channels 256 --heads 8 --context 128) as
# starpipe-gpt, starpipe-llama with multi-head attention (--kv-heads 8) and with
# grouped-query attention (--kv-heads 2), each `mpirun -np 2` under 1F1B, alternated
# ROUNDS times (default 3). Per run the median step time and the median MFU of steps
# 2..N (the app's own lines: MFU counts each model's own FLOPs, so it compares kernels
# across models of different sizes), then the medians over the rounds.
set -eu
build=${1:-build}; rounds=${2:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
big="--layers 8 --channels 256 --heads 8 --context 128 --steps 8"
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
median() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
ms() { grep -E '^step [0-9]+ ' "$1" | tail -n +2 | sed -E 's/.* ([0-9.]+) ms( .*)?$/\1/' | median; }
mfu() { grep -E '^step [0-9]+ ' "$1" | tail -n +2 | sed -E 's/.*MFU ([0-9.]+)%.*/\1/' | median; }
params() { sed -n -E 's/^(GPT|Llama): ([0-9]+) parameters.*/\2/p' "$1"; }
run() { mpirun -np 2 "$build/apps/$1" $big $2 >"$dir/$3" 2>&1; }
echo "| round | GPT ms (MFU) | Llama MHA ms (MFU) | Llama GQA 8/2 ms (MFU) |"
echo "| --- | --- | --- | --- |"
for r in $(seq 1 "$rounds"); do
  run starpipe-gpt "" gpt; run starpipe-llama "--kv-heads 8" mha; run starpipe-llama "--kv-heads 2" gqa
  for k in gpt mha gqa; do ms "$dir/$k" >>"$dir/$k.ms"; mfu "$dir/$k" >>"$dir/$k.mfu"; done
  echo "| $r | $(ms "$dir/gpt") ($(mfu "$dir/gpt")%) | $(ms "$dir/mha") ($(mfu "$dir/mha")%) | $(ms "$dir/gqa") ($(mfu "$dir/gqa")%) |"
done
echo
for k in gpt mha gqa; do
  echo "$k: $(params "$dir/$k") parameters, median $(median <"$dir/$k.ms") ms/step, MFU $(median <"$dir/$k.mfu")%"
done
