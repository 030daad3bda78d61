#!/bin/sh
# perfmodel.sh MPIEXEC APP: StarPU sees the stages. After a 2-rank run, StarPU's history
# performance models hold each rank's per-stage task times: starpipe_F_r0 an entry for
# stage 0 (footprint 1), starpipe_BW_r1 one for stage 1 (footprint 2), with samples.
set -e
mpiexec=$1; app=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
STARPU_HOME=$dir "$mpiexec" -np 2 -x STARPU_HOME "$app" --layers 2 --channels 16 --heads 2 \
  --context 16 --batch 2 --steps 3 >"$dir/log" 2>&1 || { cat "$dir/log"; exit 1; }
check() { # check SYMBOL FOOTPRINT
  f=$(find "$dir/.starpu/sampling/codelets" -name "$1.*" | head -1)
  [ -n "$f" ] || { echo "FAIL: no performance model $1"; find "$dir" -type f; exit 1; }
  awk -v fp="$2" '$1 == fp && $NF + 0 > 0 { ok = 1 } END { exit !ok }' "$f" ||
    { cat "$f"; echo "FAIL: $1 has no samples for footprint $2"; exit 1; }
}
check starpipe_F_r0 00000001
check starpipe_BW_r0 00000001
check starpipe_F_r1 00000002
check starpipe_BW_r1 00000002
echo "ok: per-stage task times in StarPU's performance models"
