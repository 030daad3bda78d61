#!/bin/sh
# llama_app.sh MPIEXEC LLAMA MAKE_SHARDS: starpipe-llama as users run it, files compared byte for
# byte with a --reference run (no --check, no in-process reference):
#  - every built-in schedule at P = 2, 1F1B at P = 4, replicas (R = 2 x P = 2, and ZeRO-1),
#    tensor parallelism (T = 2 x P = 2: KV groups split), recomputation, bf16 products,
#    evaluation, token shards with --vocab, one run with the ranks unbound (--bind-to
#    none): the first step's gradients (--dump-grads) and
#    the checkpoint after 2 steps (--save) equal `--reference`'s at the same layout;
#  - checkpoints in Hugging Face's names: saved at P = 2, resumed at P = 1 with the
#    reference's bytes there; --init from it;
#  - sampling and --log work; bad configurations (KV heads not dividing heads, an odd head
#    size, T not dividing the KV heads) and bad --init files (another model's, a missing
#    one, misshapen tensors, --init with --load): one clear message and a non-zero exit.
set -e
mpiexec=$1; app=$2; make_shards=$3
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
"$make_shards" /usr/share/common-licenses/GPL-3 "$dir/gpl" --shard-tokens 9000 >/dev/null
shards="$dir/gpl_*.bin"
tiny="--layers 4 --channels 32 --heads 4 --kv-heads 2 --hidden 48 --context 8 --batch 2 --microbatches 4"
fail() { cat "$dir/log"; echo "FAIL: $*"; exit 1; }
# same R P T SCHEDULE [flags]: the pipelined run writes the reference's bytes
same() {
  R=$1 P=$2 T=$3 sched=$4; shift 4
  "$app" --reference --replicas "$R" --actors "$P" --tensor "$T" --schedule "$sched" --steps 2 \
    --dump-grads "$dir/ref.grads" --save "$dir/ref.ckpt" "$@" >"$dir/log" 2>&1 ||
    fail "R=$R P=$P T=$T $sched $*: the reference failed"
  # shellcheck disable=SC2086
  "$mpiexec" -np $((R * P * T)) --oversubscribe ${MPIFLAGS:-} "$app" --replicas "$R" --tensor "$T" \
    --schedule "$sched" --steps 2 --dump-grads "$dir/run.grads" --save "$dir/run.ckpt" "$@" \
    >"$dir/log" 2>&1 || fail "R=$R P=$P T=$T $sched $*: the run failed"
  grep -q "^Llama: " "$dir/log" || fail "the run does not describe a Llama"
  cmp "$dir/ref.grads" "$dir/run.grads" || fail "R=$R P=$P T=$T $sched $*: gradients differ"
  cmp "$dir/ref.ckpt" "$dir/run.ckpt" || fail "R=$R P=$P T=$T $sched $*: checkpoint differs"
}
for sched in gpipe 1f1b eager-1f1b interleaved-1f1b zb-h1 zb-v dualpipe-v auto; do
  same 1 2 1 "$sched" $tiny
done
same 1 4 1 1f1b $tiny
same 2 2 1 1f1b $tiny
same 2 1 1 1f1b $tiny --shard-optimizer
same 1 2 2 1f1b $tiny
same 1 2 1 zb-h1 $tiny --recompute
same 1 2 1 1f1b $tiny --precision bf16
same 1 2 1 1f1b $tiny --eval-every 1
same 1 2 1 1f1b $tiny --data "$shards" --vocab 300
MPIFLAGS="--bind-to none" same 1 2 2 zb-h1 $tiny # ranks unbound
echo "ok: every schedule at P = 2, P = 4, R = 2 (ZeRO-1), T = 2, recomputation, bf16, evaluation, token shards, ranks unbound"

# Hugging Face's names; saved at P = 2, resumed at P = 1 with the reference's bytes there
"$mpiexec" -np 2 --oversubscribe "$app" --steps 2 --save "$dir/p2.ckpt" $tiny >"$dir/log" 2>&1 ||
  fail "the P = 2 run failed"
for name in model.embed_tokens.weight model.layers.3.self_attn.q_proj.weight \
    model.layers.3.self_attn.k_proj.weight model.layers.3.self_attn.v_proj.weight \
    model.layers.0.self_attn.o_proj.weight model.layers.0.mlp.gate_proj.weight \
    model.layers.0.mlp.up_proj.weight model.layers.0.mlp.down_proj.weight \
    model.layers.0.input_layernorm.weight model.layers.0.post_attention_layernorm.weight \
    model.norm.weight lm_head.weight; do
  grep -q "\"$name\"" "$dir/p2.ckpt" || fail "the checkpoint has no tensor $name"
done
! grep -q "qkv_proj\|gate_up_proj" "$dir/p2.ckpt" || fail "the checkpoint holds fused tensors"
"$app" --reference --steps 2 --load "$dir/p2.ckpt" --save "$dir/ref.ckpt" $tiny >"$dir/log" 2>&1 ||
  fail "resume at P = 1: the reference failed"
"$app" --reference --actors 2 --steps 2 --load "$dir/p2.ckpt" --save "$dir/ref2.ckpt" $tiny \
  >"$dir/log" 2>&1 || fail "resume at P = 2: the reference failed"
"$mpiexec" -np 1 "$app" --steps 2 --load "$dir/p2.ckpt" --save "$dir/run.ckpt" $tiny \
  >"$dir/log" 2>&1 || fail "resume at P = 1 failed"
cmp "$dir/ref.ckpt" "$dir/run.ckpt" || fail "resumed at P = 1: not the reference's bytes"
"$mpiexec" -np 2 --oversubscribe "$app" --steps 2 --init "$dir/p2.ckpt" --save "$dir/run.ckpt" \
  $tiny >"$dir/log" 2>&1 || fail "--init at P = 2 failed"
"$app" --reference --actors 2 --steps 2 --init "$dir/p2.ckpt" --save "$dir/ref.ckpt" $tiny \
  >"$dir/log" 2>&1 || fail "--init: the reference failed"
cmp "$dir/ref.ckpt" "$dir/run.ckpt" || fail "--init at P = 2: not the reference's bytes"
echo "ok: Hugging Face's names; saved at P = 2, resumed at P = 1; --init"

# sampling and the log
"$mpiexec" -np 2 --oversubscribe "$app" --steps 3 --sample 24 --temperature 0 --log "$dir/log.jsonl" \
  $tiny >"$dir/log" 2>&1 || fail "--sample/--log run failed"
grep -q "^sample (24 bytes, temperature 0" "$dir/log" || fail "no sample printed"
[ "$(wc -l <"$dir/log.jsonl")" -eq 3 ] || fail "--log: not one line per step"
echo "ok: --sample, --log"

# bad configurations: one message, a non-zero exit
bad() {
  want=$1; shift
  if "$mpiexec" -np 2 --oversubscribe "$app" --steps 1 "$@" >"$dir/log" 2>&1; then
    fail "$* was accepted"
  fi
  grep -q "$want" "$dir/log" || fail "$*: no message '$want'"
}
bad "3 KV heads do not divide 4 heads" --heads 4 --kv-heads 3 --channels 32
bad "the head size 3" --heads 4 --channels 12
bad "does not divide the 1 KV heads" $tiny --tensor 2 --kv-heads 1
bad "are the Llama's" --arch gpt --kv-heads 2
"$app" --arch gpt --reference --steps 0 --save "$dir/gpt.ckpt" --layers 4 --channels 32 --heads 4 \
  --context 8 --batch 2 >"$dir/log" 2>&1 || fail "the GPT checkpoint for --init failed"
bad "no tensor 'model.embed_tokens.weight'" $tiny --init "$dir/gpt.ckpt"
bad "missing.safetensors" $tiny --init "$dir/missing.safetensors"
bad "k_proj.weight' is F32 (16,32) in the file, F32 (or BF16, F16) (8,32) in this model" --layers 4 --channels 32 --heads 4 --kv-heads 1 --hidden 48 \
  --context 8 --batch 2 --init "$dir/p2.ckpt"
bad "one of them" $tiny --init "$dir/p2.ckpt" --load "$dir/p2.ckpt"
echo "ok: refusals"
