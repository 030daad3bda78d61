#!/bin/sh
# fxt_trace.sh MPIEXEC APP FXT_TOOL [app flags...]: StarPU's own FxT trace must show the
# pipeline's traffic (needs a StarPU built with FxT: scripts/build-starpu-cuda). A 2-rank
# run of 2 steps, launched the default way with STARPU_FXT_TRACE=1, writes one trace per
# rank; starpu_fxt_tool matches their MPI transfers into the Paje trace's links (MPIL).
# Those links must be exactly the plan's messages: as many as the plan moves in 2 steps
# ("plan: ... messages per step"), each rank's count and bytes those it says it sent over
# StarPU-MPI (STARPIPE_VERBOSE=1), each message of the plan once a step (the tag's message
# number) and always from the same rank, and every link ending on the other rank. Over the direct transport (STARPIPE_TRANSPORT=
# direct) the same run's trace must show no link at all: what the trace sees is what
# StarPU-MPI carried.
set -e
mpiexec=$1; app=$2; tool=$3; shift 3
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { cat "$dir/log"; echo "FAIL: $*"; exit 1; }
[ -x "$tool" ] || { echo "FAIL: no starpu_fxt_tool at $tool"; exit 1; }

run() { # $1: transport, then the app's flags; leaves $dir/log and $dir/out/paje.trace
  t=$1; shift
  rm -rf "$dir/trace_"* "$dir/out"; mkdir -p "$dir/out"
  STARPIPE_TRANSPORT=$t STARPIPE_VERBOSE=1 STARPU_FXT_TRACE=1 STARPU_FXT_PREFIX="$dir" \
    STARPU_FXT_SUFFIX=trace "$mpiexec" -np 2 -x STARPIPE_TRANSPORT -x STARPIPE_VERBOSE \
    -x STARPU_FXT_TRACE -x STARPU_FXT_PREFIX -x STARPU_FXT_SUFFIX "$app" --steps 2 "$@" \
    >"$dir/log" 2>&1 || fail "$t: the run failed"
  [ -s "$dir/trace_0" ] && [ -s "$dir/trace_1" ] ||
    fail "$t: STARPU_FXT_TRACE=1 left no trace per rank in $dir ($(ls "$dir" | tr '\n' ' '))"
  "$tool" -d "$dir/out" -i "$dir/trace_0" "$dir/trace_1" >"$dir/tool.log" 2>&1 ||
    { cat "$dir/tool.log"; fail "$t: starpu_fxt_tool failed"; }
  [ -s "$dir/out/paje.trace" ] || fail "$t: starpu_fxt_tool wrote no paje.trace"
}

check() { # $1: transport
  python3 - "$dir/log" "$dir/out/paje.trace" "$1" <<'PY' || fail "$1: $(cat "$dir/why")"
import re, sys
log, paje, transport = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3]
# a link's start: 23 date MPIL MPIroot size <src>_mpict mpicom_<id> tag; its end:
# 19 date MPIL MPIroot size <dst>_mpict mpicom_<id> (starpu_fxt_mpi.c)
starts = re.findall(r"^23\t\S+\tMPIL\tMPIroot\t(\d+)\t(\d+)_mpict\tmpicom_(\d+)\t(-?\d+)$", paje, re.M)
ends = {i: int(d) for _, d, i in
        re.findall(r"^19\t\S+\tMPIL\tMPIroot\t(\d+)\t(\d+)_mpict\tmpicom_(\d+)$", paje, re.M)}
plan = re.search(r"plan: \d+ tasks, (\d+) messages per step", log)
rows = {int(r): (int(n), int(b)) for r, n, b in
        re.findall(r"rank (\d+): transfers over \S+: (\d+) sends \((\d+) bytes\)", log)}
why = None
if not plan or sorted(rows) != [0, 1]:
    why = "the run did not print its plan and both ranks' transfers (STARPIPE_VERBOSE=1)"
elif transport == "direct":
    if starts or ends:
        why = f"over direct the trace shows {len(starts)} StarPU-MPI transfers, not 0"
else:
    m = int(plan.group(1))
    per = {0: [0, 0], 1: [0, 0]}
    seen = {}  # message number -> (sender, count)
    for size, src, ident, tag in starts:
        # the transport's tag is (step << 32) | message; 1.3.10's starpu_fxt_tool keeps
        # its low 32 bits only (an int: starpu_fxt.c, handle_mpi_isend_submit_end)
        src, msg = int(src), int(tag) & 0xffffffff
        if src not in per or ends.get(ident) != 1 - src:
            why = f"link {ident} from rank {src} ends on rank {ends.get(ident)}"
            break
        if msg >= m or seen.get(msg, (src, 0))[0] != src:
            why = f"tag {tag}: message {msg} is not one of the plan's {m} from rank {src}"
            break
        seen[msg] = (src, seen.get(msg, (src, 0))[1] + 1)
        per[src][0] += 1
        per[src][1] += int(size)
    if not why and len(starts) != 2 * m:
        why = f"the trace shows {len(starts)} transfers; the plan moves {m} a step, {2 * m} in 2"
    if not why and sorted(n for _, n in seen.values()) != [2] * m:
        why = "some of the plan's messages are not in the trace once a step"
    for r in (0, 1):
        if not why and tuple(per[r]) != rows[r]:
            why = (f"rank {r}: the trace shows {per[r][0]} transfers of {per[r][1]} bytes, "
                   f"the rank says it sent {rows[r][0]} of {rows[r][1]} bytes")
open(sys.argv[1].rsplit("/", 1)[0] + "/why", "w").write(why or "")
if not why:
    print(f"{transport}: {len(starts)} transfers in the trace")
sys.exit(1 if why else 0)
PY
}

run starpu-mpi "$@"
check starpu-mpi
run direct "$@"
check direct
echo "ok: StarPU's FxT trace shows the plan's messages over StarPU-MPI, none over direct"
