#!/bin/sh
# tokenizer.sh MPIEXEC APP: --sample through a tokenizer.json (--tokenizer).
# 1. Without Hugging Face's tokenizers: a tokenizer written here (GPT-2's byte alphabet at
#    ids 1..256, <|endoftext|> at 0) over a model of 260 tokens trained on byte shards;
#    the sample of 2 pipelined ranks is byte for byte the --reference run's, starts at
#    <|endoftext|>, and shows ids without a token as [id N]. Refusals before step 1, each
#    naming what is wrong: a file that is not a tokenizer, --prompt with --tokenizer, a
#    tokenizer larger than --vocab, --tokenizer without --sample, and a subword model
#    sampled as bytes.
# 2. With them (else a note): the README's GPT-2 124M example in small
#    (bench/gpt2_124m.sh): scripts/make-shards --bpe 512 learns GPT-2's kind of tokenizer
#    from the GPL text, `--model gpt2` (its vocabulary of 50257, 2 of its layers, context
#    32) trains on the shards and samples through it, the same bytes pipelined and
#    --reference.
set -e
mpiexec=$1; app=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { cat "$dir/log"; echo "FAIL: $*"; exit 1; }
text=/usr/share/common-licenses/GPL-3
shards="$(dirname "$0")/../../scripts/make-shards"
common="--layers 2 --channels 32 --heads 2 --context 32 --batch 2 --microbatches 2 --steps 6"
"$shards" "$text" "$dir/bytes" >/dev/null || fail "make-shards"
python3 - "$dir/bytes.json" <<'EOF'
import json, sys
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): b + 1 for b, c in zip(bs, cs)}
json.dump({"model": {"type": "BPE", "vocab": vocab, "merges": []},
           "added_tokens": [{"id": 0, "content": "<|endoftext|>", "special": True}],
           "decoder": {"type": "ByteLevel"}}, open(sys.argv[1], "w"))
EOF
sample() { # OUT [flags]: the sample (its header and text) of a run: the end of its
  # stdout (what StarPU or MPI print at shutdown goes to stderr)
  out=$1; shift
  "$@" >"$dir/log" 2>"$dir/err" || { cat "$dir/err" >>"$dir/log"; fail "$*"; }
  sed -n '/^sample (/,$p' "$dir/log" >"$out"
  [ -s "$out" ] || fail "no sample in the output of $*"
}
run1="--data $dir/bytes_*.bin --vocab 260 --sample 48 --tokenizer $dir/bytes.json $common"
sample "$dir/pipe.txt" "$mpiexec" -np 2 --oversubscribe "$app" $run1
sample "$dir/ref.txt" "$app" --reference $run1
cmp "$dir/pipe.txt" "$dir/ref.txt" || fail "the pipelined sample differs from --reference's"
head -1 "$dir/pipe.txt" | grep -q '^sample (48 tokens, .* after "<|endoftext|>":' ||
  fail "the sample's header: $(head -1 "$dir/pipe.txt")"

refused() { # WHAT [flags]: the run fails before step 1 and says WHAT
  what=$1; shift
  if "$@" >"$dir/log" 2>&1; then fail "accepted: $*"; fi
  grep -q "$what" "$dir/log" || fail "no '$what' in the refusal of $*"
  if grep -q "^step 1 " "$dir/log"; then fail "refused only after training: $*"; fi
}
echo '{"model": {"type": "Unigram"}}' >"$dir/unigram.json"
bytes="--data $dir/bytes_*.bin $common"
refused "only BPE" "$mpiexec" -np 2 --oversubscribe "$app" $bytes --vocab 260 --sample 4 \
  --tokenizer "$dir/unigram.json"
refused "does not encode text" "$app" $bytes --vocab 260 --sample 4 --tokenizer \
  "$dir/bytes.json" --prompt "x"
refused "257 tokens do not fit the model's vocabulary of 256" "$mpiexec" -np 2 \
  --oversubscribe "$app" $bytes --sample 4 --tokenizer "$dir/bytes.json"
refused "needs --sample" "$app" $bytes --vocab 260 --tokenizer "$dir/bytes.json"
refused "printed as bytes" "$app" $bytes --vocab 260 --sample 4

if python3 -c 'import tokenizers' 2>/dev/null; then
  "$shards" "$text" "$dir/bpe" --bpe 512 >/dev/null 2>&1 || fail "make-shards --bpe 512"
  run2="--model gpt2 --layers 2 --context 32 --batch 1 --microbatches 2 --steps 3
        --data $dir/bpe_0*.bin --sample 24 --tokenizer $dir/bpe_tokenizer.json"
  sample "$dir/pipe2.txt" "$mpiexec" -np 2 --oversubscribe "$app" $run2
  sample "$dir/ref2.txt" "$app" --reference $run2
  cmp "$dir/pipe2.txt" "$dir/ref2.txt" || fail "BPE: the pipelined sample differs"
  echo "ok: GPT-2's shape on a learned BPE, its sample pipelined and --reference alike:"
  cat "$dir/pipe2.txt"
else
  echo "note: no Hugging Face tokenizers (pip install tokenizers): the learned BPE's part skipped"
fi
echo "ok: samples through --tokenizer, the same bytes pipelined; refusals before step 1"
