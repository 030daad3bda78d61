#!/bin/sh
# rank_pid.sh APP TAG RANK: the pid of MPI rank RANK of a run of APP launched with
# STARPIPE_KILL_TAG=TAG exported to its ranks (mpiexec -x STARPIPE_KILL_TAG), found by
# the environment of each process; nothing printed when there is none.
app=$1; tag=$2; rank=$3
for pid in $(pgrep -f "$app"); do
  if tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | grep -q "^STARPIPE_KILL_TAG=$tag$" &&
     tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | grep -q "^OMPI_COMM_WORLD_RANK=$rank\$"; then
    echo "$pid"
    exit 0
  fi
done
