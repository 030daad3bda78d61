#!/bin/sh
# fresh_home.sh MPIEXEC APP: the first run in a fresh StarPU home. StarPU measures the bus
# and writes its files there when they are missing; ranks that did so at once read each
# other's half-written files and aborted (4 runs in 15 at 8 ranks before runtime/exec/buslock.c
# took a lock around it). Now one rank measures, the others read its files: exactly one
# "calibrating" line per run, and every run passes. StarPU prints that line only when not
# told to be silent: a user's STARPU_SILENT is cleared here.
set -e
mpiexec=$1; app=$2
unset STARPU_SILENT
for i in 1 2 3; do
  dir=$(mktemp -d)
  STARPU_HOME=$dir "$mpiexec" -np 8 --oversubscribe -x STARPU_HOME "$app" --replicas 4 \
    --steps 1 >"$dir/log" 2>&1 || { cat "$dir/log"; rm -rf "$dir"; echo "FAIL: run $i"; exit 1; }
  n=$(grep -c "No performance model for the bus, calibrating" "$dir/log" || true)
  rm -rf "$dir"
  [ "$n" = 1 ] || { echo "FAIL: run $i: $n ranks measured the bus (expected 1)"; exit 1; }
done
echo "ok: one rank of 8 measured the bus in a fresh StarPU home, 3 runs"
