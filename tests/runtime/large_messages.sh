#!/bin/sh
# large_messages.sh MPIEXEC APP: boundary tensors above the transport's eager limit (256 KB
# here, over 128 KB). Over StarPU-MPI (the default transport) as StarPU-MPI's sends of
# private copies, most posted by the task that wrote them.
# With STARPIPE_TRANSPORT=direct, between ranks of one node as eager pieces (comm/direct.c:
# its default, each rank having a core here), and with STARPIPE_SHM_PIECES=0 as one
# message each, as between nodes; either way every
# send leaves from a private copy so that the sender's buffer is free at once, most are
# posted by the task that wrote them. The pieces also run with ranks unbound
# (--bind-to none). Every run must write the --reference run's bytes,
# and their ranks must report that the path under test was taken (else this test covers
# nothing).
set -e
mpiexec=$1; app=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { cat "$dir/log"; echo "FAIL: $*"; exit 1; }
flags="--layers 4 --channels 64 --heads 2 --context 128 --batch 8 --schedule interleaved-1f1b --microbatches 4"
# shellcheck disable=SC2086
"$app" --reference --actors 2 --steps 2 --dump-grads "$dir/ref.grads" --save "$dir/ref.ckpt" \
  $flags >"$dir/log" 2>&1 || fail "the reference run failed"
# one field of the two ranks' verbose lines: the number before TEXT
field() { sed -n "s/.* \([0-9.]*\) $1.*/\1/p" "$dir/log"; }
# over StarPU-MPI: its bytes, every rank naming it
# shellcheck disable=SC2086
STARPIPE_VERBOSE=1 "$mpiexec" -np 2 "$app" --steps 2 --dump-grads "$dir/p.grads" \
  --save "$dir/p.ckpt" $flags >"$dir/log" 2>&1 || fail "the pipelined run over StarPU-MPI failed"
cmp "$dir/ref.grads" "$dir/p.grads" || fail "gradients differ from the reference (StarPU-MPI)"
cmp "$dir/ref.ckpt" "$dir/p.ckpt" || fail "checkpoint differs from the reference (StarPU-MPI)"
[ "$(grep -c 'transfers over starpu-mpi: [1-9]' "$dir/log")" -eq 2 ] ||
  fail "the two ranks did not both send over StarPU-MPI"
# both ranks' figures above 0 (one line each), or fail with WHY
positive() {
  [ "$(echo "$1" | wc -l)" -eq 2 ] && echo "$1" | awk '$1 > 0 { n++ } END { exit n == 2 ? 0 : 1 }' ||
    fail "$2: $(echo $1)"
}
copies=$(sed -n 's/.*copies of sends in flight \([0-9.]*\) MiB.*/\1/p' "$dir/log")
early=$(field "sends posted by their producing task")
positive "$copies" "StarPU-MPI: a rank sent no message through a copy"
positive "$early" "StarPU-MPI: a rank's producing tasks posted no send"
echo "ok: StarPU-MPI: the reference's bytes; copies $(echo $copies) MiB, sends posted by" \
  "their producer $(echo $early)"
export STARPIPE_TRANSPORT=direct
for run in default default:--bind-to:none 0; do
  pieces=${run%%:*}; bind=$(echo "${run#"$pieces"}" | tr ':' ' ')
  if [ "$pieces" = default ]; then unset STARPIPE_SHM_PIECES; else export STARPIPE_SHM_PIECES=$pieces; fi
  # shellcheck disable=SC2086
  STARPIPE_VERBOSE=1 "$mpiexec" -np 2 $bind "$app" --steps 2 \
    --dump-grads "$dir/p.grads" --save "$dir/p.ckpt" $flags >"$dir/log" 2>&1 ||
    fail "the pipelined run failed (STARPIPE_SHM_PIECES=$pieces)"
  cmp "$dir/ref.grads" "$dir/p.grads" || fail "gradients differ from the reference (pieces $pieces)"
  cmp "$dir/ref.ckpt" "$dir/p.ckpt" || fail "checkpoint differs from the reference (pieces $pieces)"
  copies=$(sed -n 's/.*copies of sends in flight \([0-9.]*\) MiB.*/\1/p' "$dir/log")
  cut=$(field "in eager pieces")
  early=$(field "sends posted by their producing task")
  [ "$(echo "$cut" | wc -l)" -eq 2 ] || fail "expected one transfer line per rank, got: $cut"
  positive "$copies" "a rank sent no message through a copy"
  positive "$early" "a rank's producing tasks posted no send"
  if [ "$pieces" = default ]; then
    echo "$cut" | awk '$1 > 0 { n++ } END { exit n == 2 ? 0 : 1 }' ||
      fail "a rank cut no transfer into pieces: $cut"
  else
    echo "$cut" | awk '$1 == 0 { n++ } END { exit n == 2 ? 0 : 1 }' ||
      fail "STARPIPE_SHM_PIECES=0 still cut transfers into pieces: $cut"
  fi
  echo "ok: pieces $pieces$bind: the reference's bytes; copies $(echo $copies) MiB," \
    "pieces $(echo $cut), sends posted by their producer $(echo $early)"
done
