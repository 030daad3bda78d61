#!/bin/sh
# resume.sh MPIEXEC APP: steps 1..4 in one run equal steps 1..2, save, then 3..4 resumed
# under another schedule and another rank count (4 ranks, a V schedule, one rank, the
# reference interpreter): the final checkpoints (parameters, AdamW moments, step) must
# be byte-identical files. The same with a learning-rate schedule (warmup, then cosine
# decay): the resumed runs name no schedule flag, the checkpoint carries it, and its
# horizon (--decay-steps, else the run's last step) stays that of the run it continues.
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
# the schedule over the 4 steps of the straight run (its horizon by default); the first
# half says where the decay ends, the second half inherits it
lrs="--warmup 1 --lr-decay cosine --lr-min 1e-4"
run 2 --steps 4 --schedule 1f1b $lrs --save "$dir/lr_straight.st"
run 2 --steps 2 --schedule 1f1b $lrs --decay-steps 4 --save "$dir/lr_half.st"
run 4 --steps 2 --schedule gpipe --load "$dir/lr_half.st" --save "$dir/lr_resumed4.st"
"$app" $common --reference --steps 2 --load "$dir/lr_half.st" --save "$dir/lr_resumedref.st" \
  >"$dir/log" 2>&1 || { cat "$dir/log"; exit 1; }
cmp "$dir/lr_straight.st" "$dir/lr_resumed4.st"
cmp "$dir/lr_straight.st" "$dir/lr_resumedref.st"
# a horizon past the run's end is kept on resume, not replaced by the resumed run's own
# last step (which would be 4 here, and give other bits)
run 2 --steps 4 --schedule 1f1b $lrs --decay-steps 6 --save "$dir/lr6_straight.st"
run 2 --steps 2 --schedule 1f1b $lrs --decay-steps 6 --save "$dir/lr6_half.st"
run 1 --steps 2 --schedule 1f1b --load "$dir/lr6_half.st" --save "$dir/lr6_resumed1.st"
cmp "$dir/lr6_straight.st" "$dir/lr6_resumed1.st"
if cmp -s "$dir/lr_straight.st" "$dir/lr6_straight.st"; then
  echo "FAIL: the horizon changes nothing"; exit 1
fi
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
echo "ok: resumed runs (constant and scheduled learning rate) are byte-identical to the straight run; broken checkpoints refused"
