#!/bin/sh
# launch_bits.sh MPIEXEC APP NP [app flags...]: the bits of a run must not depend on how
# its ranks are launched. The first step's gradients (--dump-grads) and the checkpoint
# after two steps (--save) of a pipelined run on NP ranks, launched the default way, with
# --bind-to none, and (NP > 2) bound with several ranks per core, must be byte-identical
# files to those of a --reference run. No --check: nothing in the pipelined processes may
# set state (such as the kernel library's thread count) that the reference would set.
set -e
mpiexec=$1; app=$2; np=$3; shift 3
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { cat "$dir/log"; echo "FAIL: $*"; exit 1; }
"$app" --reference --actors "$np" --steps 2 --dump-grads "$dir/ref.grads" --save "$dir/ref.ckpt" \
  "$@" >"$dir/log" 2>&1 || fail "the reference run failed"
modes="default none"
[ "$np" -gt 2 ] && modes="$modes overload"
for mode in $modes; do
  case $mode in
    default) bind="" ;;
    none) bind="--bind-to none" ;;
    overload) bind="--bind-to core:overload-allowed" ;;
  esac
  rm -f "$dir/p.grads" "$dir/p.ckpt"
  # shellcheck disable=SC2086
  "$mpiexec" -np "$np" $bind "$app" --steps 2 --dump-grads "$dir/p.grads" --save "$dir/p.ckpt" \
    "$@" >"$dir/log" 2>&1 || fail "np $np, bind $mode: the run failed"
  cmp "$dir/ref.grads" "$dir/p.grads" || fail "np $np, bind $mode: gradients differ from the reference"
  cmp "$dir/ref.ckpt" "$dir/p.ckpt" || fail "np $np, bind $mode: checkpoint differs from the reference"
done
echo "ok: $(basename "$app") on $np ranks ($modes) writes the reference's bytes"
