#!/bin/sh
# tensor_app.sh MPIEXEC GPT MLP: tensor parallelism as users run it, files compared byte
# for byte with a --reference run (no --check, no in-process reference):
#  - every built-in schedule at T = 2 with P = 1 and P = 2 (the GPT), T = 2 with R = 2
#    (8 ranks), an odd T = 3 where the model divides (the MLP, and the GPT with a
#    vocabulary of 258: it is split too), the MLP at T = 2, and
#    T = 2 with ZeRO-1, recomputation, bf16 products and evaluations:
#    the first step's gradients (--dump-grads) and the checkpoint after 2 steps (--save)
#    equal `--reference --tensor T`'s;
#  - checkpoints hold whole tensors: a run saved at (R, P, T) = (1, 2, 2) resumes at
#    (2, 1, 1), (1, 1, 2) and (1, 2, 1) with the bytes of the reference at that layout;
#  - bad input: T not dividing the heads or the vocabulary, a rank count that is not
#    R x P x T: one clear message and a non-zero exit; STARPIPE_TENSOR as the flag;
#  - the memory line of STARPIPE_VERBOSE=1: each rank's persistent buffers halve at T = 2;
#  - one run with the ranks unbound (--bind-to none);
#  - scatter-gather forced on one host (STARPIPE_SCATTER_GATHER=1) in 10 of those
#    layouts, and the bytes rank 0 sends falling by half of the boundary tensors'.
set -e
mpiexec=$1; gpt=$2; mlp=$3
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
tiny="--layers 4 --channels 24 --heads 6 --context 8 --batch 2 --microbatches 4"
fail() { cat "$dir/log"; echo "FAIL: $*"; exit 1; }
# same R P T SCHEDULE APP [flags]: the pipelined run writes the reference's bytes
same() {
  R=$1 P=$2 T=$3 sched=$4 app=$5; shift 5
  "$app" --reference --replicas "$R" --actors "$P" --tensor "$T" --schedule "$sched" --steps 2 \
    --dump-grads "$dir/ref.grads" --save "$dir/ref.ckpt" "$@" >"$dir/log" 2>&1 ||
    fail "R=$R P=$P T=$T $sched: the reference failed"
  # shellcheck disable=SC2086
  "$mpiexec" -np $((R * P * T)) --oversubscribe ${MPIFLAGS:-} "$app" --replicas "$R" --tensor "$T" \
    --schedule "$sched" --steps 2 --dump-grads "$dir/run.grads" --save "$dir/run.ckpt" "$@" \
    >"$dir/log" 2>&1 || fail "R=$R P=$P T=$T $sched: the run failed"
  grep -q "of $T ranks (tensor parallelism)" "$dir/log" || [ "$T" = 1 ] ||
    fail "R=$R P=$P T=$T $sched: the run does not say it is tensor-parallel"
  cmp "$dir/ref.grads" "$dir/run.grads" || fail "R=$R P=$P T=$T $sched: gradients differ"
  cmp "$dir/ref.ckpt" "$dir/run.ckpt" || fail "R=$R P=$P T=$T $sched: checkpoint differs"
}
for sched in gpipe 1f1b eager-1f1b zb-h1; do same 1 1 2 "$sched" "$gpt" $tiny; done
for sched in gpipe 1f1b eager-1f1b interleaved-1f1b zb-h1 zb-v dualpipe-v auto; do
  same 1 2 2 "$sched" "$gpt" $tiny
done
same 2 2 2 1f1b "$gpt" $tiny
same 1 1 3 1f1b "$mlp" --width 24 --depth 4
same 1 1 3 1f1b "$gpt" $tiny --vocab 258 # 3 divides 258 = 2 x 3 x 43 (bytes fit)
same 1 2 2 1f1b "$mlp" --width 24 --depth 4
# with ZeRO-1, recomputation, bf16 products, an evaluation
same 2 1 2 1f1b "$gpt" $tiny --shard-optimizer
same 1 2 2 zb-h1 "$gpt" $tiny --recompute
same 1 1 2 1f1b "$gpt" $tiny --precision bf16
same 1 2 2 1f1b "$gpt" $tiny --eval-every 1
MPIFLAGS="--bind-to none" same 1 2 2 1f1b "$gpt" $tiny # ranks unbound
echo "ok: every schedule at T = 2 (P = 1, 2), R = 2 x P = 2 x T = 2, the MLP at T = 3 and 2; ZeRO-1, recomputation, bf16, evaluation"

# scatter-gather, forced on one host (across hosts it is the default: tests/hosts): each
# member sends 1/T of a boundary tensor and the next group all-gathers it; the same bytes
# in the files, and fewer on the wire. The MLP cut inside a pair (--stage-layers 1,2 of
# depth 3) has a boundary tensor its members hold in parts: that one goes whole.
export STARPIPE_SCATTER_GATHER=1
for sched in 1f1b interleaved-1f1b zb-v dualpipe-v; do same 1 2 2 "$sched" "$gpt" $tiny; done
same 2 2 2 1f1b "$gpt" $tiny --shard-optimizer
same 1 2 2 zb-h1 "$gpt" $tiny --recompute --precision bf16 --eval-every 1
same 1 2 3 1f1b "$mlp" --width 24 --depth 4 --batch 5 # chunks of unequal sizes
same 1 2 2 1f1b "$mlp" --width 24 --depth 3 --stage-layers 1,2
STARPIPE_TRANSPORT=direct same 1 2 2 1f1b "$gpt" $tiny
# the bytes sent: the boundary tensors' half (the tied weight's messages stay whole)
bytes() { sed -n 's/.*rank 0: transfers over [a-z-]*: [0-9]* sends (\([0-9]*\) bytes).*/\1/p' "$dir/log"; }
STARPIPE_VERBOSE=1 same 1 2 2 1f1b "$gpt" $tiny; on=$(bytes)
STARPIPE_SCATTER_GATHER=0 STARPIPE_VERBOSE=1 same 1 2 2 1f1b "$gpt" $tiny; off=$(bytes)
# 4 microbatches, a forward and a backward message each, of batch 2 x context 8 x 24 floats
[ -n "$on" ] && [ $((off - on)) = $((4 * 2 * 2 * 8 * 24 * 4 / 2)) ] ||
  fail "scatter-gather: rank 0 sent $on bytes, $off without it"
unset STARPIPE_SCATTER_GATHER
echo "ok: scatter-gather forced (STARPIPE_SCATTER_GATHER=1): 4 schedules, R = 2 with ZeRO-1, recomputation with bf16 and evaluation, T = 3, a boundary inside a pair, the direct transport; rank 0 sent $on bytes against $off"

# whole tensors: saved at (1, 2, 2), resumed elsewhere with the reference's bytes there
"$mpiexec" -np 4 --oversubscribe "$gpt" --tensor 2 --steps 2 --save "$dir/half.ckpt" $tiny \
  >"$dir/log" 2>&1 || fail "the (1, 2, 2) run failed"
for to in "2 1 1" "1 1 2" "1 2 1"; do
  set -- $to
  "$gpt" --reference --replicas "$1" --actors "$2" --tensor "$3" --steps 2 --load "$dir/half.ckpt" \
    --save "$dir/ref.ckpt" $tiny >"$dir/log" 2>&1 || fail "resume at ($to): the reference failed"
  "$mpiexec" -np $(($1 * $2 * $3)) --oversubscribe "$gpt" --replicas "$1" --tensor "$3" --steps 2 \
    --load "$dir/half.ckpt" --save "$dir/run.ckpt" $tiny >"$dir/log" 2>&1 ||
    fail "resume at ($to) failed"
  cmp "$dir/ref.ckpt" "$dir/run.ckpt" || fail "resumed at ($to): not the reference's bytes"
done
echo "ok: saved at (R, P, T) = (1, 2, 2), resumed at (2, 1, 1), (1, 1, 2), (1, 2, 1)"

# bad input
if "$mpiexec" -np 4 --oversubscribe "$gpt" --tensor 4 --steps 1 $tiny >"$dir/log" 2>&1; then
  fail "T = 4 with 6 heads was accepted"
fi
grep -q "does not divide" "$dir/log" || fail "T = 4 with 6 heads: no clear message"
if "$mpiexec" -np 3 --oversubscribe "$gpt" --tensor 2 --steps 1 $tiny >"$dir/log" 2>&1; then
  fail "3 ranks at T = 2 were accepted"
fi
grep -q "multiple of 2" "$dir/log" || fail "3 ranks at T = 2: no clear message"
# a vocabulary T does not divide: padded to a multiple of 128 T (256: 384 at T = 3), the
# reference's bytes
"$mpiexec" -np 3 --oversubscribe "$gpt" --tensor 3 --steps 2 $tiny --save "$dir/t3.st" \
  >"$dir/log" 2>&1 || fail "T = 3 with a vocabulary of 256 (padded to 384)"
"$gpt" --reference --tensor 3 --steps 2 $tiny --save "$dir/t3ref.st" >"$dir/log" 2>&1 ||
  fail "--reference --tensor 3, vocabulary 256"
cmp "$dir/t3.st" "$dir/t3ref.st" || fail "T = 3, vocabulary 256 padded: not the reference's bytes"
# the variable, as a user may set it instead of the flag
STARPIPE_TENSOR=2 "$mpiexec" -np 2 --oversubscribe -x STARPIPE_TENSOR "$gpt" --steps 1 $tiny \
  >"$dir/log" 2>&1 || fail "STARPIPE_TENSOR=2: the run failed"
grep -q "of 2 ranks (tensor parallelism)" "$dir/log" || fail "STARPIPE_TENSOR=2 was not taken"
echo "ok: refusals, STARPIPE_TENSOR"

# memory per rank, as STARPIPE_VERBOSE prints it: persistent buffers at T = 2 at most 0.55 of
# T = 1's (the split parameters, their gradients and moments halve; LayerNorms, biases
# after the sums and wpe stay whole)
mem() {
  STARPIPE_VERBOSE=1 "$mpiexec" -np "$1" --oversubscribe -x STARPIPE_VERBOSE "$gpt" --tensor "$1" \
    --steps 1 $tiny >"$dir/log" 2>&1 || fail "STARPIPE_VERBOSE=1 at T = $1 failed"
  sed -n 's/.*rank 0: per-microbatch.*persistent buffers \([0-9.]*\) MiB.*/\1/p' "$dir/log"
}
m1=$(mem 1); m2=$(mem 2)
[ -n "$m1" ] && [ -n "$m2" ] || fail "no persistent-buffers line (T = 1: '$m1', T = 2: '$m2')"
awk -v a="$m1" -v b="$m2" 'BEGIN { exit !(b > 0 && b <= 0.55 * a) }' ||
  fail "persistent buffers per rank $m1 MiB at T = 1, $m2 MiB at T = 2: not halved"
echo "ok: persistent buffers per rank $m1 MiB at T = 1, $m2 MiB at T = 2"
