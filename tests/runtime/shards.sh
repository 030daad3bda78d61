#!/bin/sh
# shards.sh MPIEXEC APP: token shards train on the same tokens as the text they came from.
# The GPL text written as shards by scripts/make-shards (shards of 7000 tokens, so windows
# cross shard boundaries) gives the first step's gradients of the text file byte for byte
# (--dump-grads, cmp); a pipelined run with 2 replicas on shards passes --check; and a run
# of 4 steps equals 2 steps, save, resume 2 on the shards, byte for byte (the windows are
# a function of the step: the resumed run reads what the straight one read).
set -e
mpiexec=$1; app=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { cat "$dir/log"; echo "FAIL: $*"; exit 1; }
text=/usr/share/common-licenses/GPL-3
"$(dirname "$0")/../../scripts/make-shards" "$text" "$dir/gpl" --shard-tokens 7000 >"$dir/list" ||
  fail "make-shards"
[ "$(wc -l <"$dir/list")" -ge 4 ] || fail "expected several shards"
common="--layers 2 --channels 16 --heads 2 --context 32 --batch 2 --microbatches 2"
"$app" --reference $common --steps 1 --dump-grads "$dir/text.grads" >"$dir/log" 2>&1 ||
  fail "reference on the text"
"$app" --reference $common --steps 1 --data "$dir/gpl_*.bin" --dump-grads "$dir/shards.grads" \
  >"$dir/log" 2>&1 || fail "reference on the shards"
grep -q "tokens in [0-9]* shards" "$dir/log" || fail "the banner does not say shards"
cmp "$dir/text.grads" "$dir/shards.grads" || fail "shards and text give other gradients"
"$mpiexec" -np 4 --oversubscribe "$app" $common --replicas 2 --steps 2 --check \
  --data "$dir/gpl_*.bin" >"$dir/log" 2>&1 || fail "2 replicas on shards with --check"
run() { "$mpiexec" -np 2 --oversubscribe "$app" $common --data "$dir/gpl_*.bin" "$@" >"$dir/log" 2>&1 || fail "mpirun $*"; }
run --steps 4 --save "$dir/straight.st"
run --steps 2 --save "$dir/half.st"
run --steps 2 --load "$dir/half.st" --save "$dir/resumed.st"
cmp "$dir/straight.st" "$dir/resumed.st" || fail "a resumed run read other data"
# a shard cut short is refused before any step, naming it
head -c 2000 "$dir/gpl_000001.bin" >"$dir/cut.bin"
if "$app" --reference $common --steps 1 --data "$dir/cut.bin" >"$dir/log" 2>&1; then
  fail "a truncated shard was accepted"
fi
grep -q "cut.bin" "$dir/log" && grep -q "header counts" "$dir/log" || fail "unclear refusal"
echo "ok: shards train on the text's tokens, with replicas and across a resume"
