#!/usr/bin/env bash
# Runs a command on the fake device and checks its output (tests/gpu/fake/CMakeLists.txt):
#   expect.sh [--want REGEX]... [--want-n N REGEX]... [--reject REGEX]... [--fails]
#             [--allow-emu] -- COMMAND...
# Fails when the command fails (with --fails: when it exits 0, or is killed by a
# signal, as a hang or a crash would be), when a --want line is missing, when fewer than N lines
# match a --want-n REGEX, when a line matches a --reject REGEX, or when the emulation
# reported a misuse ("EMU:", even one whose error the program ignored; --allow-emu for
# tests that provoke them). StarPU gets a
# fresh STARPU_HOME (it measures the fake bus in a fraction of a second), so that tests
# with other device counts never share calibration files.
set -uo pipefail
want=() wantn=() reject=() allow_emu=0 fails=0
while [ $# -gt 0 ]; do
  case $1 in
    --want) want+=("$2"); shift 2;;
    --want-n) wantn+=("$2" "$3"); shift 3;;
    --reject) reject+=("$2"); shift 2;;
    --allow-emu) allow_emu=1; shift;;
    --fails) fails=1; shift;;
    --) shift; break;;
    *) echo "expect.sh: unknown option $1" >&2; exit 2;;
  esac
done
home=$(mktemp -d "${TMPDIR:-/tmp}/starpipe-fake-home.XXXXXX")
trap 'rm -rf "$home"' EXIT
export STARPU_HOME=$home STARPIPE_FAKE_GPU_REPORT=1
out=$home/output.log
"$@" >"$out" 2>&1
rc=$?
cat "$out"
bad=0
if [ $fails = 0 ] && [ $rc -ne 0 ]; then echo "expect.sh: the command exited with $rc" >&2; bad=1; fi
if [ $fails = 1 ] && { [ $rc -eq 0 ] || [ $rc -gt 128 ]; }; then
  echo "expect.sh: the command exited with $rc, expected a failure of its own" >&2; bad=1
fi
if [ $allow_emu = 0 ] && grep -q '^EMU:' "$out"; then echo "expect.sh: the emulation reported a misuse" >&2; bad=1; fi
for re in "${want[@]}"; do
  grep -Eq -- "$re" "$out" || { echo "expect.sh: no line matches: $re" >&2; bad=1; }
done
for ((i = 0; i < ${#wantn[@]}; i += 2)); do
  n=${wantn[i]} re=${wantn[i + 1]}
  got=$(grep -Ec -- "$re" "$out")
  [ "$got" -ge "$n" ] || { echo "expect.sh: $got lines match $re, expected $n" >&2; bad=1; }
done
for re in "${reject[@]}"; do
  ! grep -Eq -- "$re" "$out" || { echo "expect.sh: a line matches: $re" >&2; bad=1; }
done
exit $bad
