#!/bin/sh
# padded_vocab.sh MPIEXEC APP: GPT-2's vocabulary of 50257 under --tensor 2 (issue 40):
# the apps pad it to a multiple of 128 x T (50432 here), which T divides. A run of 2
# ranks writes the bytes of `--reference --tensor 2`; its checkpoint holds 50257 rows
# (wte and lm_head.weight), and resumes at T = 1 (2 ranks, 2 actors) with the bytes of
# the reference resuming from it; the padding never changes a token's bits (the graph
# test test_padded_vocab checks that against an unpadded model).
set -e
mpiexec=$1; app=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { cat "$dir/log"; echo "FAIL: $*"; exit 1; }
m="--vocab 50257 --layers 2 --channels 32 --heads 2 --context 16 --batch 2 --microbatches 2"
run() { "$@" >"$dir/log" 2>&1 || fail "$*"; }
run "$mpiexec" -np 2 --oversubscribe "$app" $m --tensor 2 --steps 2 --save "$dir/tp.st"
grep -q "^done: 2 steps" "$dir/log" || fail "no 2 steps at --tensor 2"
run "$app" --reference --tensor 2 $m --steps 2 --save "$dir/ref.st"
cmp "$dir/tp.st" "$dir/ref.st" || fail "--tensor 2 with a padded vocabulary: not the reference's bytes"
python3 - "$dir/tp.st" <<'PY' || fail "the checkpoint does not hold 50257 rows"
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
for name in ("transformer.wte.weight", "lm_head.weight", "transformer.wte.weight.adam_m"):
    assert h[name]["shape"] == [50257, 32], (name, h[name]["shape"])
PY
run "$mpiexec" -np 2 --oversubscribe "$app" $m --steps 4 --load "$dir/tp.st" --save "$dir/t1.st"
run "$app" --reference $m --steps 4 --load "$dir/tp.st" --save "$dir/t1ref.st"
cmp "$dir/t1.st" "$dir/t1ref.st" || fail "resumed at T = 1: not the reference's bytes"
echo "ok: vocabulary 50257 at --tensor 2, bitwise; its checkpoint of 50257 rows resumes at T = 1"
