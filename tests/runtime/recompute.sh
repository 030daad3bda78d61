#!/bin/sh
# recompute.sh MPIEXEC APP: activation recomputation (--recompute) gives the bits of the
# run without it (the first step's gradients and the checkpoint after two steps, cmp),
# and lowers the first actor's per-microbatch memory of 1F1B, planned and measured
# (STARPIPE_VERBOSE=1 prints both per rank).
set -e
mpiexec=$1; app=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { cat "$dir/log"; echo "FAIL: $*"; exit 1; }
common="--layers 4 --channels 32 --heads 2 --context 32 --batch 2 --microbatches 8 --steps 2"
for r in plain recompute; do
  flag=""; [ $r = recompute ] && flag=--recompute
  STARPIPE_VERBOSE=1 "$mpiexec" -np 2 --oversubscribe -x STARPIPE_VERBOSE "$app" $common $flag \
    --dump-grads "$dir/$r.grads" --save "$dir/$r.st" >"$dir/log" 2>&1 || fail "$r run"
  line=$(grep "rank 0: per-microbatch buffers" "$dir/log") || fail "$r: no memory line"
  echo "$r: $line"
  echo "$line" | sed 's/.*buffers \([0-9.]*\) MiB.*plan \([0-9.]*\) MiB.*/\1 \2/' >"$dir/$r.mem"
done
cmp "$dir/plain.grads" "$dir/recompute.grads" || fail "recomputation changed the gradients"
cmp "$dir/plain.st" "$dir/recompute.st" || fail "recomputation changed the trained state"
read -r pm pp <"$dir/plain.mem"
read -r rm rp <"$dir/recompute.mem"
awk -v pm="$pm" -v pp="$pp" -v rm="$rm" -v rp="$rp" 'BEGIN {
  if (!(rp < 0.8 * pp)) { print "FAIL: planned " rp " MiB with recomputation, " pp " without"; exit 1 }
  if (!(rm < 0.8 * pm)) { print "FAIL: measured " rm " MiB with recomputation, " pm " without"; exit 1 }
}' || exit 1
echo "ok: the same bits; rank 0 plans $rp MiB instead of $pp and holds $rm instead of $pm"
