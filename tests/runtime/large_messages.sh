#!/bin/sh
# large_messages.sh MPIEXEC APP: boundary tensors above the transport's eager limit (256 KB
# here, over 128 KB) leave through private copies (comm/direct.c) so that the sender's
# buffer is free at once. The run must still write the --reference run's bytes, and its
# ranks must report that copies were made (else this test covers nothing).
set -e
mpiexec=$1; app=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { cat "$dir/log"; echo "FAIL: $*"; exit 1; }
flags="--layers 4 --channels 64 --heads 2 --context 128 --batch 8 --schedule interleaved-1f1b --microbatches 4"
# shellcheck disable=SC2086
"$app" --reference --actors 2 --steps 2 --dump-grads "$dir/ref.grads" --save "$dir/ref.ckpt" \
  $flags >"$dir/log" 2>&1 || fail "the reference run failed"
# shellcheck disable=SC2086
STARPIPE_VERBOSE=1 "$mpiexec" -np 2 "$app" --steps 2 --dump-grads "$dir/p.grads" \
  --save "$dir/p.ckpt" $flags >"$dir/log" 2>&1 || fail "the pipelined run failed"
cmp "$dir/ref.grads" "$dir/p.grads" || fail "gradients differ from the reference"
cmp "$dir/ref.ckpt" "$dir/p.ckpt" || fail "checkpoint differs from the reference"
copies=$(sed -n 's/.*copies of large sends in flight \([0-9.]*\) MiB.*/\1/p' "$dir/log")
[ "$(echo "$copies" | wc -l)" -eq 2 ] || fail "expected one memory line per rank, got: $copies"
echo "$copies" | awk '$1 > 0 { n++ } END { exit n == 2 ? 0 : 1 }' ||
  fail "a rank sent no large message through a copy: $copies"
echo "ok: 256 KB boundary tensors through copies ($(echo $copies) MiB), the reference's bytes"
