#!/usr/bin/env bash
# The device memory check before step 1 (apps/driver.c, device_memory_short) against what
# a run really holds on the fake device (CMakeLists.txt: gpu_fake.device_memory_bound*):
#   devmem.sh -- COMMAND...   (COMMAND: the app, under mpiexec or not)
# 1. With STARPIPE_VERBOSE=1 on 4096 MiB devices every GPU rank prints its estimate before
#    step 1 ("needs N bytes (buffers B bytes, ...") and, after the run, the bytes in use on
#    its device U. For every rank B <= U <= B + 32 MiB: the estimate holds no more than
#    the run placed there, and misses at most the one 32 MiB chunk StarPU suballocates
#    buffers of 4 MiB or less from (the need N counts that chunk in its reserve).
# 2. On devices of the smallest size in MiB whose StarPU cap (90%, rounded down to MiB)
#    holds the largest N: the run passes.
# 3. One MiB less: refused on every rank before step 1, with the message, promptly.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ "${1:-}" = -- ] && shift
fail() { echo "devmem.sh: $*" >&2; exit 1; }
MiB=1048576

out=$(STARPIPE_VERBOSE=1 STARPIPE_FAKE_GPU_MIB=4096 "$here/expect.sh" -- "$@" 2>&1)
rc=$?
echo "$out" | grep -E 'device memory|^step|^done'
[ $rc = 0 ] || { echo "$out"; fail "the run on 4096 MiB devices failed"; }
est=$(echo "$out" | sed -n 's/^starpipe: rank \([0-9]*\): device memory: actor [0-9]* needs \([0-9]*\) bytes (buffers \([0-9]*\) bytes.*/\1 \2 \3/p')
used=$(echo "$out" | sed -n 's/^starpipe: rank \([0-9]*\): device memory: \([0-9]*\) bytes in use .*/\1 \2/p')
[ -n "$est" ] || fail "no rank printed its estimate"
need=0
while read -r rank n b; do
  u=$(echo "$used" | awk -v r="$rank" '$1 == r { print $2 }')
  [ -n "$u" ] || fail "rank $rank printed no device use after the run"
  echo "rank $rank: estimate $b bytes of buffers (need $n), $u bytes in use after the run"
  [ "$b" -le "$u" ] || fail "rank $rank: the estimate ($b bytes) is above what the run holds ($u)"
  [ "$u" -le $((b + 32 * MiB)) ] || fail "rank $rank: the run holds $u bytes, more than the estimate ($b) and one 32 MiB chunk"
  [ "$n" -gt "$need" ] && need=$n
done <<<"$est"

# the smallest device whose cap floor(0.9 x MiB) MiB holds the need
want=$(( (need + MiB - 1) / MiB ))
mib=$want
while [ $(( mib * 9 / 10 )) -lt "$want" ]; do mib=$((mib + 1)); done
echo "largest need $need bytes: devices of $mib MiB hold it, $((mib - 1)) MiB do not"
STARPIPE_FAKE_GPU_MIB=$mib "$here/expect.sh" --want '^done:' -- "$@" >/dev/null 2>&1 ||
  fail "the run on $mib MiB devices failed (STARPIPE_FAKE_GPU_MIB=$mib to see it)"
start=$(date +%s)
out=$(STARPIPE_FAKE_GPU_MIB=$((mib - 1)) "$here/expect.sh" --fails \
        --want 'actor [0-9]+ needs .* of GPU memory .* but device [0-9]+ has .* free; the largest part is the ' \
        --reject '^step 1 ' -- "$@" 2>&1)
rc=$?
secs=$(( $(date +%s) - start ))
echo "$out" | grep -E 'error'
[ $rc = 0 ] || { echo "$out"; fail "on $((mib - 1)) MiB devices the run was not refused as it should be"; }
[ $secs -le 60 ] || fail "the refusal took $secs s"
echo "PASS"
