#!/bin/sh
# resume.sh MPIEXEC APP: checkpoints of GPU ranks, whose slabs live in device memory
# only (read and written through bounded copies, runtime/host.c): steps 1..4 in one run
# equal steps 1..2, save, then 3..4 resumed, byte for byte: on 2 ranks, on 1 rank, and
# two replicas with ZeRO-1's sharded moments on 4 ranks. (Replicas resumed without them
# differ in the last bits on the device, where only the CPU promises bitwise sums over
# any R: not checked here.) Each run's output goes to stdout, so that expect.sh sees the
# device's reports (kernels ran on it).
set -e
mpiexec=$1; app=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
common="--layers 4 --channels 16 --heads 2 --context 16 --batch 2 --microbatches 4 --schedule 1f1b"
run() {
  np=$1; shift
  STARPIPE_FAKE_GPUS=$np "$mpiexec" -np "$np" --oversubscribe "$app" $common "$@" >"$dir/log" 2>&1 ||
    { cat "$dir/log"; echo "FAIL: $*"; exit 1; }
  cat "$dir/log"
  grep -q "fake device 0 .* [1-9][0-9]* kernels" "$dir/log" || { echo "FAIL: no kernels on the device: $*"; exit 1; }
}
run 2 --steps 4 --save "$dir/straight.st"
run 2 --steps 2 --save "$dir/half.st"
run 2 --steps 2 --load "$dir/half.st" --save "$dir/resumed2.st"
run 1 --steps 2 --load "$dir/half.st" --save "$dir/resumed1.st"
cmp "$dir/straight.st" "$dir/resumed2.st"
cmp "$dir/straight.st" "$dir/resumed1.st"
run 4 --steps 4 --replicas 2 --shard-optimizer --save "$dir/r_straight.st"
run 4 --steps 2 --replicas 2 --shard-optimizer --save "$dir/r_half.st"
run 4 --steps 2 --replicas 2 --shard-optimizer --load "$dir/r_half.st" --save "$dir/r_resumed2.st"
cmp "$dir/r_straight.st" "$dir/r_resumed2.st"
echo "PASS: resumed checkpoints of device slabs are byte-identical"
