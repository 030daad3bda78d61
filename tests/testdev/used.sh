#!/bin/sh
# used.sh APP: the test device really is the rank's device. On it, a run says "testdev",
# every task runs on the device's worker (StarPU's worker statistics: none on the host's
# worker), data crosses between the two memory nodes both ways (StarPU's bus statistics),
# and the run is checked bitwise against the reference interpreter (--check), since the
# device's kernels are the CPU's. Without STARPIPE_DEVICE the same launch has no device.
set -e
app=$1
. "$(dirname "$0")/env.sh"
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { cat "$dir/log"; echo "FAIL: $*"; exit 1; }
STARPU_BUS_STATS=1 STARPU_WORKER_STATS=1 "$app" --steps 2 --check >"$dir/log" 2>&1 ||
  fail "the run on the test device failed"
grep -q "microbatches, testdev, checked against the reference$" "$dir/log" ||
  fail "the run did not say it ran on the test device, checked bitwise"
grep -q "every step bitwise equal to the reference" "$dir/log" || fail "not bitwise equal"
python3 - "$dir/log" <<'PY' || fail "$(cat "$dir/why")"
import re, sys
log = open(sys.argv[1]).read()
why = None
tasks = [int(n) for n in re.findall(r"CPU \d+\s*\n\s*(\d+) task\(s\)", log)]
moved = {(a, b): int(n) for a, b, n in
         re.findall(r"NUMA (\d) -> NUMA (\d)\s.*\(transfers : (\d+)", log)}
if len(tasks) != 2:
    why = f"StarPU's worker statistics list {len(tasks)} workers, not 2"
elif tasks[0] != 0 or tasks[1] == 0:
    why = f"tasks per worker {tasks}: all should run on the device's worker (the second)"
elif not moved.get(("0", "1")) or not moved.get(("1", "0")):
    why = f"transfers between the memory nodes {moved}: expected both ways"
open(sys.argv[1].rsplit("/", 1)[0] + "/why", "w").write(why or "")
sys.exit(1 if why else 0)
PY
STARPIPE_DEVICE=cpu STARPU_WORKER_STATS=1 "$app" --steps 1 >"$dir/log" 2>&1 ||
  fail "the run without the device failed"
grep -q "microbatches, CPU$" "$dir/log" || fail "STARPIPE_DEVICE=cpu still named a device"
STARPIPE_DEVICE=nosuch "$app" --steps 1 >"$dir/log" 2>&1 && fail "STARPIPE_DEVICE=nosuch ran"
grep -q "STARPIPE_DEVICE=nosuch: this build has no such device (it has: cpu.*testdev)" \
  "$dir/log" || fail "STARPIPE_DEVICE=nosuch: not the expected message"
echo "ok: the test device ran every task, bitwise equal to the reference"
