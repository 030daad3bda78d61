#!/bin/sh
# resume.sh MPIEXEC APP: steps 1..4 in one run equal steps 1..2, save, then 3..4 resumed
# under another schedule and another rank count (4 ranks, a V schedule, one rank, the
# reference interpreter): the final checkpoints (parameters, AdamW moments, step) must
# be byte-identical files.
set -e
mpiexec=$1; app=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
common="--layers 4 --channels 16 --heads 2 --context 16 --batch 2 --microbatches 4"
run() { np=$1; shift; "$mpiexec" -np "$np" --oversubscribe "$app" $common "$@" >"$dir/log" 2>&1 || { cat "$dir/log"; exit 1; }; }
run 2 --steps 4 --schedule 1f1b --save "$dir/straight.st"
run 2 --steps 2 --schedule 1f1b --save "$dir/half.st"
run 4 --steps 2 --schedule gpipe --load "$dir/half.st" --save "$dir/resumed4.st"
run 2 --steps 2 --schedule zb-v --load "$dir/half.st" --save "$dir/resumedv.st"
run 1 --steps 2 --schedule 1f1b --load "$dir/half.st" --save "$dir/resumed1.st"
"$app" $common --reference --steps 2 --load "$dir/half.st" --save "$dir/resumedref.st" >"$dir/log" 2>&1 ||
  { cat "$dir/log"; exit 1; }
cmp "$dir/straight.st" "$dir/resumed4.st"
cmp "$dir/straight.st" "$dir/resumedv.st"
cmp "$dir/straight.st" "$dir/resumed1.st"
cmp "$dir/straight.st" "$dir/resumedref.st"
# a checkpoint of another model is refused, naming what differs
if "$mpiexec" -np 2 --oversubscribe "$app" --layers 2 --channels 16 --heads 2 --context 16 \
     --load "$dir/half.st" --steps 1 >"$dir/log" 2>&1; then
  echo "FAIL: loaded a checkpoint of another model"; exit 1
fi
grep -q "layers=4" "$dir/log" || { cat "$dir/log"; echo "FAIL: message does not name the model"; exit 1; }
# a checkpoint cut in half, or with one byte flipped, is refused and nothing runs
size=$(stat -c %s "$dir/half.st")
head -c $((size / 2)) "$dir/half.st" > "$dir/cut.st"
cp "$dir/half.st" "$dir/flip.st"
printf '\377' | dd of="$dir/flip.st" bs=1 seek=$((size - 100)) conv=notrunc status=none
for bad in cut flip; do
  if "$mpiexec" -np 2 --oversubscribe "$app" $common --load "$dir/$bad.st" --steps 1 >"$dir/log" 2>&1; then
    echo "FAIL: loaded the $bad checkpoint"; exit 1
  fi
  grep -Eq "truncated|checksum" "$dir/log" || { cat "$dir/log"; echo "FAIL: $bad: unclear message"; exit 1; }
  ! grep -q "^step" "$dir/log" || { echo "FAIL: $bad: training ran"; exit 1; }
done
echo "ok: resumed runs are byte-identical to the straight run; broken checkpoints refused"
