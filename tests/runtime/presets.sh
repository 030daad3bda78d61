#!/bin/sh
# presets.sh MPIEXEC GPT LLAMA PLAN: the model presets (starpipe/models.h, one table for the
# apps' --model and the planner's --gpt and --llama), as users name them:
#  - `--model gpt-small` is the GPT's defaults and `--model llama-small` the Llama's: their
#    checkpoints byte for byte those of the plain runs (2 ranks);
#  - `--model gpt2 --layers 2 --context 64` (GPT-2 124M's widths, 12 heads, 768 channels,
#    50257 tokens, two of its blocks) writes the bytes of the same shape given flag by flag,
#    and a flag before --model overrides it as one after does;
#  - starpipe-plan's --gpt gpt2 / gpt2-xl and --llama llama2-13b predict what their shapes
#    written out predict;
#  - an unknown name, or a preset of the other architecture than --arch: one message
#    naming the known ones or the conflict, non-zero.
set -e
mpiexec=$1; gpt=$2; llama=$3; plan=$4
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { cat "$dir/log"; echo "FAIL: $*"; exit 1; }
run() { # OUT ARGS...: 2 ranks, ${steps:-2} steps, the checkpoint in $dir/OUT
  out=$1; shift
  "$mpiexec" -np 2 --oversubscribe "$@" --steps "${steps:-2}" --save "$dir/$out" >"$dir/log" 2>&1 ||
    fail "$* failed"
}
run a.ckpt "$gpt"
run b.ckpt "$gpt" --model gpt-small
cmp "$dir/a.ckpt" "$dir/b.ckpt" || fail "--model gpt-small is not the GPT's defaults"
run a.ckpt "$llama"
run b.ckpt "$gpt" --model llama-small
cmp "$dir/a.ckpt" "$dir/b.ckpt" || fail "starpipe-gpt --model llama-small is not starpipe-llama's defaults"
echo "ok: gpt-small and llama-small are the apps' defaults"

small="--context 64 --batch 1 --microbatches 2"
steps=1 # a step of GPT-2's 50257 x 768 embedding takes a second here
run a.ckpt "$gpt" --layers 2 --heads 12 --channels 768 --vocab 50257 $small
# 2 blocks and the embedding of 50304 rows (50257 padded to a multiple of 128)
grep -q "^GPT: 52859904 parameters (vocabulary 50257 padded to 50304), 2 layers, 12 heads, 768 channels, context 64" "$dir/log" ||
  fail "GPT-2's widths: not the parameter count of 2 of its blocks"
run b.ckpt "$gpt" --model gpt2 --layers 2 $small
cmp "$dir/a.ckpt" "$dir/b.ckpt" || fail "--model gpt2 --layers 2: not the shape given flag by flag"
run b.ckpt "$gpt" --layers 2 --context 64 --model gpt2 --batch 1 --microbatches 2
cmp "$dir/a.ckpt" "$dir/b.ckpt" || fail "--layers 2 ... --model gpt2: the flags before it lost"
echo "ok: --model gpt2 with --layers 2 and --context 64, flags before or after it"

same_plan() { # ARGS of a preset, ARGS written out
  "$plan" --schedule 1f1b --actors 4 --device-flops 989e12 $1 >"$dir/log" 2>&1 || fail "$1"
  grep -E "^(step time|model|memory)" "$dir/log" >"$dir/p1"
  "$plan" --schedule 1f1b --actors 4 --device-flops 989e12 $2 >"$dir/log" 2>&1 || fail "$2"
  grep -E "^(step time|model|memory)" "$dir/log" >"$dir/p2"
  [ -s "$dir/p1" ] && cmp -s "$dir/p1" "$dir/p2" || { cat "$dir/p1" "$dir/p2"; fail "$1 is not $2"; }
}
same_plan "--gpt gpt2" "--gpt 12,768,1024,50257"
same_plan "--gpt gpt2-xl,2" "--gpt 48,1600,1024,50257,2"
same_plan "--llama llama2-13b" "--llama 40,5120,40,40,13824,4096,32000"
echo "ok: the planner's --gpt gpt2, gpt2-xl,2 and --llama llama2-13b"

if "$gpt" --reference --model gpt4 --steps 1 >"$dir/log" 2>&1; then fail "--model gpt4 accepted"; fi
grep -q "model gpt4: not a model this knows (gpt-small, gpt2, .*llama2-70b)" "$dir/log" ||
  fail "--model gpt4: no message naming the known ones"
if "$gpt" --reference --arch gpt --model llama2-7b --steps 1 >"$dir/log" 2>&1; then
  fail "--arch gpt --model llama2-7b accepted"
fi
grep -q "model llama2-7b is a llama, but --arch says gpt" "$dir/log" || fail "no message for the conflict"
if "$plan" --schedule 1f1b --actors 4 --llama gpt2 >"$dir/log" 2>&1; then fail "--llama gpt2 accepted"; fi
grep -q -- "--llama: expected llama2-7b" "$dir/log" || fail "--llama gpt2: no message"
echo "ok: refusals"
