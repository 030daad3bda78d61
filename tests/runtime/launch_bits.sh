#!/bin/sh
# launch_bits.sh MPIEXEC APP NP [app flags...]: the bits of a run must not depend on how
# its ranks are launched. The first step's gradients (--dump-grads) and the checkpoint
# after two steps (--save) of a pipelined run on NP ranks, launched the default way, with
# --bind-to none, and (NP > 2) bound with several ranks per core, must be byte-identical
# files to those of a --reference run. No --check: nothing in the pipelined processes may
# set state (such as the kernel library's thread count) that the reference would set.
# Each pipelined run must also have moved its messages over the transport asked for
# (STARPIPE_TRANSPORT, else the default): every rank names it, and the ranks' sends add
# up to the plan's messages per step x steps, each received once with the same bytes.
# StarPU-MPI's own statistics (STARPU_COMM_STATS=1, printed at shutdown) must see exactly
# the bytes each rank sent over StarPU-MPI, and nothing over the direct transport.
set -e
mpiexec=$1; app=$2; np=$3; shift 3
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { cat "$dir/log"; echo "FAIL: $*"; exit 1; }
want=${STARPIPE_TRANSPORT:-starpu-mpi}
# the transfers of the run in $dir/log (STARPIPE_VERBOSE=1), against the plan's messages
check_transport() {
  python3 - "$dir/log" "$np" "$want" <<'PY' || fail "np $np, bind $mode: $(cat "$dir/why")"
import re, struct, sys
log, np, want = open(sys.argv[1]).read(), int(sys.argv[2]), sys.argv[3]
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]  # StarPU prints (float)sum
totals = {int(r): float(b) for r, b in
          re.findall(r"\[starpu_comm_stats\]\[(\d+)\] TOTAL:\s+([0-9.]+) B", log)}
per_dst = {}
for r, _, b in re.findall(r"\[starpu_comm_stats\]\[(\d+):(\d+)\]\s+([0-9.]+) B", log):
    per_dst[int(r)] = per_dst.get(int(r), 0.0) + float(b)
msgs = re.search(r"plan: \d+ tasks, (\d+) messages per step", log)
# --schedule auto's probe trainer ran 2 steps of its own plan before the run's
probe = re.search(r"the probe: 2 steps of (\d+) messages", log)
rows = re.findall(r"rank (\d+): transfers over (\S+): (\d+) sends \((\d+) bytes\), (\d+) "
                  r"receives \((\d+) bytes\)", log)
why = None
if len(rows) != np:
    why = f"{len(rows)} ranks said what carried their transfers, not {np}"
elif any(r[1] != want for r in rows):
    why = f"transfers went over {sorted(set(r[1] for r in rows))}, not {want}"
else:
    sends, sent, recvs, got = (sum(int(r[k]) for r in rows) for k in (2, 3, 4, 5))
    expect = 2 * int(msgs.group(1)) + (2 * int(probe.group(1)) if probe else 0) if msgs else -1
    if sends != expect or recvs != expect or sent != got or (np > 1 and sent == 0):
        why = (f"{sends} sends ({sent} bytes) and {recvs} receives ({got} bytes) over {want}; "
               f"the plan moves {expect} messages in 2 steps")
    elif sorted(totals) != list(range(np)):
        why = f"StarPU-MPI's statistics (STARPU_COMM_STATS=1) came from ranks {sorted(totals)}"
    else:
        for r in rows:
            rank, sent_r = int(r[0]), int(r[3]) if want == "starpu-mpi" else 0
            spread = abs(per_dst.get(rank, 0.0) - totals[rank])
            if totals[rank] != f32(sent_r) or spread > 1 + 1e-6 * totals[rank]:
                why = (f"rank {rank}: StarPU-MPI's statistics count {totals[rank]:.0f} bytes "
                       f"sent ({per_dst.get(rank, 0.0):.0f} over its destinations), not "
                       f"{sent_r} (rank {rank} sent {r[3]} bytes over {want})")
                break
open(sys.argv[1].rsplit("/", 1)[0] + "/why", "w").write(why or "")
sys.exit(1 if why else 0)
PY
}
"$app" --reference --actors "$np" --steps 2 --dump-grads "$dir/ref.grads" --save "$dir/ref.ckpt" \
  "$@" >"$dir/log" 2>&1 || fail "the reference run failed"
modes="default none"
[ "$np" -gt 2 ] && modes="$modes overload"
for mode in $modes; do
  case $mode in
    default) bind="" ;;
    none) bind="--bind-to none" ;;
    overload) bind="--bind-to core:overload-allowed" ;;
  esac
  rm -f "$dir/p.grads" "$dir/p.ckpt"
  # shellcheck disable=SC2086
  STARPIPE_VERBOSE=1 STARPU_COMM_STATS=1 "$mpiexec" -np "$np" $bind -x STARPIPE_VERBOSE \
    -x STARPU_COMM_STATS "$app" --steps 2 \
    --dump-grads "$dir/p.grads" --save "$dir/p.ckpt" "$@" >"$dir/log" 2>&1 ||
    fail "np $np, bind $mode: the run failed"
  check_transport
  cmp "$dir/ref.grads" "$dir/p.grads" || fail "np $np, bind $mode: gradients differ from the reference"
  cmp "$dir/ref.ckpt" "$dir/p.ckpt" || fail "np $np, bind $mode: checkpoint differs from the reference"
done
echo "ok: $(basename "$app") on $np ranks ($modes) writes the reference's bytes, its messages over $want"
