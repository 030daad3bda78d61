#!/bin/sh
# replicas.sh MPIEXEC APP R P [app flags...]: R replicas of a P-actor pipeline on R x P
# ranks must write the bytes of the single-process reference over the same R x m
# microbatches (--reference --replicas R): the first step's gradients (--dump-grads) and
# the checkpoint after two steps (--save), compared with cmp, no in-process reference.
# Runs: the default launch; --bind-to none; the sharded optimizer (ZeRO-1); replica-major
# rank order; the hierarchical all-reduce with and without ZeRO-1. The sharded run thus
# also equals the unsharded one.
set -e
mpiexec=$1; app=$2; R=$3; P=$4; shift 4
np=$((R * P))
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { cat "$dir/log"; echo "FAIL: R=$R P=$P: $*"; exit 1; }
"$app" --reference --replicas "$R" --actors "$P" --steps 2 --dump-grads "$dir/ref.grads" \
  --save "$dir/ref.ckpt" "$@" >"$dir/log" 2>&1 || fail "the reference run failed"
for mode in default unbound sharded replica-major hierarchical hierarchical-sharded; do
  # hierarchical: runs of (R + 1) / 2 replicas taken as hosts (STARPIPE_ALLREDUCE=hosts:K): the
  # sums hop from run to run, the results come back through each run's leader
  unset STARPIPE_ALLREDUCE
  case $mode in
    default) extra="" ;;
    unbound) extra="--bind-to none" ;;
    sharded) extra="" ; flags="--shard-optimizer" ;;
    replica-major) extra="" ; flags="--rank-order replica" ;;
    hierarchical) extra="" ; export STARPIPE_ALLREDUCE=hosts:$(((R + 1) / 2)) ;;
    hierarchical-sharded) extra="" ; flags="--shard-optimizer"
                          export STARPIPE_ALLREDUCE=hosts:$(((R + 1) / 2)) ;;
  esac
  rm -f "$dir/p.grads" "$dir/p.ckpt"
  # shellcheck disable=SC2086
  "$mpiexec" -np "$np" --oversubscribe $extra "$app" --replicas "$R" --steps 2 ${flags:-} \
    --dump-grads "$dir/p.grads" --save "$dir/p.ckpt" "$@" >"$dir/log" 2>&1 ||
    fail "$mode: the run failed"
  flags=""
  cmp "$dir/ref.grads" "$dir/p.grads" || fail "$mode: gradients differ from the reference"
  cmp "$dir/ref.ckpt" "$dir/p.ckpt" || fail "$mode: checkpoint differs from the reference"
done
echo "ok: $R replicas x $P actors (default, unbound, sharded, replica-major) write the reference's bytes"
