#!/bin/sh
# replicas_resume.sh MPIEXEC APP: a checkpoint written by one layout resumes exactly under
# another. Steps 1-2 by 2 replicas x 2 actors with the sharded optimizer; its checkpoint
# must equal the unsharded run's byte for byte. Then steps 3-4 resumed under other
# layouts (3 replicas x 1 actor sharded, 1 replica x 2 actors, 2 x 1 unsharded from the
# sharded file) must equal the reference interpreter resumed from the same file with the
# same replicas (--reference --replicas R), byte for byte.
set -e
mpiexec=$1; app=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
common="--layers 2 --channels 16 --heads 2 --context 16 --batch 2 --microbatches 2"
fail() { cat "$dir/log"; echo "FAIL: $*"; exit 1; }
run() { np=$1; shift; "$mpiexec" -np "$np" --oversubscribe "$app" $common "$@" >"$dir/log" 2>&1 || fail "mpirun -np $np $*"; }
ref() { "$app" $common --reference "$@" >"$dir/log" 2>&1 || fail "--reference $*"; }
run 4 --replicas 2 --shard-optimizer --steps 2 --save "$dir/half_sharded.st"
run 4 --replicas 2 --steps 2 --save "$dir/half.st"
cmp "$dir/half.st" "$dir/half_sharded.st" || fail "sharded and unsharded checkpoints differ"
for layout in "3 3 1 --shard-optimizer" "2 1 2" "2 2 1"; do
  set -- $layout; np=$1; R=$2; P=$3; shift 3
  rm -f "$dir/a.st" "$dir/b.st"
  run "$np" --replicas "$R" "$@" --steps 2 --load "$dir/half_sharded.st" --save "$dir/a.st"
  ref --replicas "$R" --actors "$P" --steps 2 --load "$dir/half_sharded.st" --save "$dir/b.st"
  cmp "$dir/a.st" "$dir/b.st" || fail "resumed as $R x $P $*: differs from the reference"
done
echo "ok: checkpoints resume exactly across replicas, actors and sharding"
