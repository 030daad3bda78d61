#!/bin/sh
# perfmodel.sh MPIEXEC APP: StarPU sees the stages. After a 2-rank run, StarPU's history
# performance models hold each rank's per-stage task times: one entry with samples per
# model (starpipe_F_r0 and starpipe_BW_r0 for stage 0, ..._r1 for stage 1), keyed by the
# stage and the sizes, and a stage's F and BW keys differ from the other stage's.
set -e
mpiexec=$1; app=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
STARPU_HOME=$dir "$mpiexec" -np 2 -x STARPU_HOME "$app" --layers 2 --channels 16 --heads 2 \
  --context 16 --batch 2 --steps 3 >"$dir/log" 2>&1 || { cat "$dir/log"; exit 1; }
key() { # key SYMBOL: the footprint of its one entry with samples
  f=$(find "$dir/.starpu/sampling/codelets" -name "$1.*" | head -1)
  [ -n "$f" ] || { echo "FAIL: no performance model $1" >&2; find "$dir" -type f >&2; exit 1; }
  k=$(awk 'length($1) == 8 && $1 ~ /^[0-9a-f]+$/ && $NF + 0 > 0 { print $1 }' "$f")
  [ "$(echo "$k" | grep -c .)" = 1 ] || { cat "$f" >&2; echo "FAIL: $1: expected one stage entry" >&2; exit 1; }
  echo "$k"
}
f0=$(key starpipe_F_r0); f1=$(key starpipe_F_r1)
b0=$(key starpipe_BW_r0); b1=$(key starpipe_BW_r1)
[ "$f0" != "$f1" ] && [ "$b0" != "$b1" ] || { echo "FAIL: stages share keys ($f0 $f1 $b0 $b1)"; exit 1; }
echo "ok: per-stage task times in StarPU's performance models"
