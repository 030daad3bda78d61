#!/bin/sh
# bf16_memory.sh MPIEXEC APP: bf16 activation storage as the runtime holds it. The default
# GPT (4 blocks of C = 64 over 2 ranks, N = 4 x 64 tokens per microbatch) under 1F1B, in
# fp32 and bf16, each also with --recompute (STARPIPE_VERBOSE=1 prints the plan's
# activation bytes per stage and each rank's per-microbatch buffers, measured and planned):
# - without recomputation every rank measures what the planner planned (with it, rank 0
#   also holds the recomputed forward's boundary output, which the plan does not count,
#   in fp32 as in bf16);
# - each stage's activations shrink by 2 bytes per element of its LayerNorm and GELU
#   outputs (2 N C + 4 N C per block, N C more for the final LayerNorm), counted here from
#   the shapes, less the alignment of the fp32 part to 16 bytes;
# - each rank's measured peak shrinks by that times the stage activations it holds live,
#   with recomputation too (the backward's own activations take the bf16 size).
set -e
mpiexec=$1; app=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { cat "$dir/log"; echo "FAIL: $*"; exit 1; }
for run in fp32 bf16 fp32-recompute bf16-recompute; do
  case $run in
    *-recompute) flags="--precision ${run%-recompute} --recompute" ;;
    *) flags="--precision $run" ;;
  esac
  STARPIPE_VERBOSE=1 "$mpiexec" -np 2 --oversubscribe -x STARPIPE_VERBOSE "$app" --steps 1 \
    $flags >"$dir/log" 2>&1 || fail "$run run"
  grep -E "stage [0-9]: activations|stage activations live|per-microbatch buffers" "$dir/log" \
    >"$dir/$run" || fail "$run: no memory lines"
  sed "s/^/$run: /" "$dir/$run"
  # measured = planned, every rank
  case $run in *-recompute) continue ;; esac
  grep "per-microbatch buffers" "$dir/$run" |
    sed 's/.*rank \([0-9]\): per-microbatch buffers \([0-9.]*\) MiB.*plan \([0-9.]*\).*/\1 \2 \3/' |
    while read -r rank got plan; do
      [ "$got" = "$plan" ] || fail "$run: rank $rank holds $got MiB, the plan says $plan"
    done
done
awk -v N=256 -v C=64 '
  FNR == 1 { run++ }
  /stage [0-9]: activations/ { s = $2 + 0; act[run, s] = $4 }
  /actor [0-9]:.*stage activations live/ {
    a = $2 + 0; live[run, a] = $0; sub(/.*, /, "", live[run, a]); live[run, a] += 0 }
  /per-microbatch buffers/ { r = $3 + 0; mib[run, r] = $6 }
  END {
    bad = 0
    for (s = 0; s < 2; s++) {
      elems = (2 * 6 + (s == 1)) * N * C           # 2 blocks per stage, lnf in the last
      rest = act[1, s] - 4 * elems                 # the fp32 part left, padded to 16 bytes
      want = 2 * elems - (16 - rest % 16) % 16
      got = act[1, s] - act[2, s]
      printf "stage %d: %d bytes of activations in fp32, %d in bf16: %d fewer (expected %d)\n",
             s, act[1, s], act[2, s], got, want
      if (got != want) { print "FAIL: stage " s " saves " got " bytes, expected " want; bad = 1 }
      if (act[3, s] != act[1, s] || act[4, s] != act[2, s]) {
        print "FAIL: stage " s ": --recompute plans other activation bytes"; bad = 1 }
      saved[s] = want
    }
    for (k = 1; k <= 3; k += 2)                     # fp32 against bf16, plain and recomputing
      for (r = 0; r < 2; r++) {                     # stage r on rank r
        want = live[k, r] * saved[r] / 1048576
        d = mib[k, r] - mib[k + 1, r]
        printf "%srank %d: %.2f MiB in fp32, %.2f in bf16 (%d stage activations live: " \
               "%.3f MiB less expected)\n", k == 3 ? "--recompute, " : "", r, mib[k, r],
               mib[k + 1, r], live[k, r], want
        if (d - want > 0.011 || want - d > 0.011) {
          print "FAIL: rank " r " holds " d " MiB less"; bad = 1 }
      }
    exit bad
  }' "$dir/fp32" "$dir/bf16" "$dir/fp32-recompute" "$dir/bf16-recompute"
echo "ok: measured as planned; bf16 holds 2 bytes less per element of its LayerNorm and GELU" \
  "outputs"
