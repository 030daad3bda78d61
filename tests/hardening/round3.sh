#!/bin/bash
# round3.sh MPIEXEC GPT LLAMA MLP POKE CASE: issue 36's cases end to end (hardening, round
# three): what a checkpoint, a signal or a shared path can do to a user's files. Each case
# fails loudly naming what went wrong; "refused" as in app_case.sh: non-zero exit within
# the limit, exactly one error line naming the cause, no step run.
mpiexec=$1 gpt=$2 llama=$3 mlp=$4 poke=$5 case=$6
dir=$(mktemp -d); trap 'pkill -f "$dir" 2>/dev/null; rm -rf "$dir"' EXIT
run2="$mpiexec -np 2 --oversubscribe"
small="--layers 2 --channels 16 --heads 2 --context 16"
. "$(dirname "$0")/refused.sh" # fail, refused

shard() { # FILE N [POS TOKEN]: N tokens 'a'..'t', one TOKEN at POS
  python3 - "$@" <<'PY'
import struct, sys
path, n = sys.argv[1], int(sys.argv[2])
toks = [ord('a') + i % 20 for i in range(n)]
if len(sys.argv) > 3: toks[int(sys.argv[3])] = int(sys.argv[4])
open(path, 'wb').write(struct.pack('<3i', 20240520, 1, n) + bytes(1012) + struct.pack('<%dH' % n, *toks))
PY
}

case $case in
  # defect 1: a checkpoint restores only the settings that define the computation
  ckpt_settings)
    "$gpt" $small --reference --steps 1 --save "$dir/a.st" >"$dir/out" 2>&1 || fail "the run failed"
    echo mine >"$dir/victim"
    for key in --save --log --dump-grads --steps --init --schedule; do
      "$poke" "$dir/a.st" "$dir/b.st" starpipe.settings \
        "$(printf -- '--seed 1337\n%s %s\n--lr 0.001\n' "$key" "$dir/victim")" || fail "ckpt_poke"
      refused 20 "b.st stores the setting '$key', which a checkpoint does not set" \
        $run2 "$gpt" --resume "$dir/b.st" --steps 1
      [ "$(cat "$dir/victim")" = mine ] || fail "$key: the file it named was replaced"
    done
    "$poke" "$dir/a.st" "$dir/c.st" starpipe.settings \
      "$(printf -- '--lr 0.002\n--layers 2\n--heads 2\n--channels 16\n--context 16\n--batch 3\n')"
    "$gpt" --reference --resume "$dir/c.st" --steps 1 >"$dir/out" 2>&1 || fail "a file of allowed settings refused"
    grep -q "batch 3 per microbatch" "$dir/out" || fail "--batch was not restored"
    echo "ok: settings that define the computation are restored, none else" ;;
  # defect 9: one rule for the two apps' models
  arch)
    "$llama" $small --reference --steps 1 --save "$dir/l.st" >"$dir/out" 2>&1 || fail "llama run"
    "$gpt" $small --reference --steps 1 --save "$dir/g.st" >"$dir/out" 2>&1 || fail "gpt run"
    "$gpt" --reference --resume "$dir/l.st" --steps 1 >"$dir/out" 2>&1 && grep -q "^Llama:" "$dir/out" ||
      fail "starpipe-gpt does not resume the Llama"
    "$llama" --reference --resume "$dir/g.st" --steps 1 >"$dir/out" 2>&1 && grep -q "^GPT:" "$dir/out" ||
      fail "starpipe-llama does not resume the GPT"
    # a file written before --arch was stored: the GPT's
    "$poke" "$dir/g.st" "$dir/old.st" starpipe.settings "$(printf -- '--layers 2\n--heads 2\n--channels 16\n--context 16\n--batch 4\n')"
    "$llama" --reference --resume "$dir/old.st" --steps 1 >"$dir/out" 2>&1 && grep -q "^GPT:" "$dir/out" ||
      fail "starpipe-llama does not resume an older GPT file"
    refused 20 "l.st is a checkpoint of another model \(--arch llama\), not of the --arch gpt .*resume it with --arch llama" \
      "$gpt" --reference --resume "$dir/l.st" --arch gpt --steps 1
    ! grep -q -- "--kv-heads" "$dir/err" || fail "blames --kv-heads, which the user did not give"
    # the rotary base is compared exactly
    "$llama" $small --rope-theta 1000000 --reference --steps 1 --save "$dir/r.st" >"$dir/out" 2>&1 || fail "theta run"
    refused 20 "another model: rope_theta=1000000 there, rope_theta=1000004 in this run" \
      "$llama" --reference --resume "$dir/r.st" --rope-theta 1000004 --steps 1
    "$llama" --reference --resume "$dir/r.st" --rope-theta 1e6 --steps 1 >"$dir/out" 2>&1 || fail "the same theta refused"
    # a file of an older build, whose signature printed the base with six digits
    sig=$("$poke" "$dir/r.st" "$dir/r2.st" starpipe.model x 2>&1; python3 -c "
import json, struct, sys
b = open(sys.argv[1], 'rb').read(); n = struct.unpack('<Q', b[:8])[0]
print(json.loads(b[8:8 + n])['__metadata__']['starpipe.model'])" "$dir/r.st")
    "$poke" "$dir/r.st" "$dir/old6.st" starpipe.model "${sig/rope_theta=1000000/rope_theta=1e+06}" || fail "ckpt_poke"
    "$llama" --reference --resume "$dir/old6.st" --steps 1 >"$dir/out" 2>&1 || fail "an older file (rope_theta=1e+06) refused"
    echo "ok: either app resumes either model; --arch and --rope-theta compared exactly" ;;
  # defect 2: no two outputs one file, no output an input
  same_file)
    "$gpt" $small --reference --steps 1 --save "$dir/in.st" >"$dir/out" 2>&1 || fail "the run failed"
    cp "$dir/in.st" "$dir/keep.st"
    cp /usr/share/common-licenses/GPL-3 "$dir/data.txt"
    export STARPIPE_TRACE="$dir/x.st"
    refused 20 "the --save file '$dir/x.st' and the STARPIPE_TRACE file '$dir/x.st' are one file" \
      $run2 -x STARPIPE_TRACE "$gpt" $small --steps 1 --save "$dir/x.st"
    unset STARPIPE_TRACE
    refused 20 "the --log file '$dir/in.st' is the --load file" \
      "$gpt" --reference --load "$dir/in.st" --steps 1 --log "$dir/in.st"
    refused 20 "the --dump-grads file '$dir/./in.st' is the --load file" \
      $run2 "$gpt" --load "$dir/in.st" --steps 1 --dump-grads "$dir/./in.st"
    ln -s in.st "$dir/link"
    refused 20 "the --save file '$dir/link' is the --init file" \
      $run2 "$gpt" $small --init "$dir/in.st" --steps 1 --save "$dir/link"
    refused 20 "the --log file .* is the data file" \
      "$gpt" $small --reference --data "$dir/data.txt" --steps 1 --log "$dir/data.txt"
    mkdir "$dir/sub"
    refused 20 "the --dump-grads file '$dir/sub/../o' and the --log file '$dir/o' are one file" \
      $run2 "$gpt" $small --steps 1 --log "$dir/o" --dump-grads "$dir/sub/../o"
    # the 70th shard of a glob is an input as much as the first
    mkdir "$dir/sh"
    shard "$dir/sh/s01.bin" 100
    for i in $(seq -w 2 70); do cp "$dir/sh/s01.bin" "$dir/sh/s$i.bin"; done
    cp "$dir/sh/s70.bin" "$dir/keep70.bin"
    refused 20 "the --log file '$dir/sh/s70.bin' is the data file" \
      $run2 "$gpt" $small --data "$dir/sh/*.bin" --steps 1 --log "$dir/sh/s70.bin"
    cmp "$dir/sh/s70.bin" "$dir/keep70.bin" || fail "the 70th shard changed"
    cmp "$dir/in.st" "$dir/keep.st" || fail "the input checkpoint changed"
    cmp "$dir/data.txt" /usr/share/common-licenses/GPL-3 || fail "the data file changed"
    [ ! -e "$dir/x.st" ] || fail "a refused run left x.st"
    # a resume may save where it loaded: each checkpoint complete before it replaces the last
    $run2 "$gpt" --resume "$dir/in.st" --steps 1 --save "$dir/in.st" >"$dir/out" 2>&1 || fail "--save onto --load refused"
    ! cmp -s "$dir/in.st" "$dir/keep.st" || fail "--save onto --load wrote nothing"
    echo "ok: outputs that are one file, or an input, refused; --save onto --load allowed" ;;
  # defect 3: a token outside the vocabulary is found before step 1
  token_range)
    shard "$dir/s1.bin" 5000
    shard "$dir/s2.bin" 20000 15000 1000
    refused 20 "token shard '$dir/s2.bin': token 1000 at position 15000 \(byte offset 31024\) is outside the vocabulary \[0,256\)" \
      $run2 "$gpt" $small --steps 1 --data "$dir/s1.bin,$dir/s2.bin"
    refused 20 "token shard '$dir/s2.bin': token 1000 at position 15000" \
      "$gpt" $small --reference --steps 1 --data "$dir/s*.bin"
    STARPIPE_VERBOSE=1 "$gpt" $small --reference --steps 1 --vocab 1024 --data "$dir/s*.bin" >"$dir/out" 2>&1 ||
      fail "the data trains with --vocab 1024"
    grep -Eq "^data: 50000 bytes of tokens checked against the vocabulary in [0-9.]+ s" "$dir/out" ||
      fail "STARPIPE_VERBOSE says nothing of the scan"
    echo "ok: a token outside the vocabulary refused before step 1, naming shard and offset" ;;
  # defect 5: the memory check holds the limits a job runs under
  mem_rlimit)
    (ulimit -v 4000000
     refused 30 "needs .* of memory in one process but it may map only .* more \(RLIMIT_AS: ulimit -v\)" \
       "$llama" --batch 2048 --context 256 --reference --steps 1) || exit 1
    (ulimit -v 4000000
     refused 30 "in one process but it may map only .* \(RLIMIT_AS" \
       $run2 "$llama" --batch 2048 --context 256 --steps 1) || exit 1
    echo "ok: a run past RLIMIT_AS is refused before MPI" ;;
  mem_cgroup)
    base=""
    v1=$(sed -n 's/^[0-9]*:memory:\(.*\)$/\1/p' /proc/self/cgroup)
    v2=$(sed -n 's/^0::\(.*\)$/\1/p' /proc/self/cgroup)
    if [ -n "$v1" ] && [ -w "/sys/fs/cgroup/memory$v1" ]; then
      base=/sys/fs/cgroup/memory$v1 limit=memory.limit_in_bytes
    elif [ -n "$v2" ] && grep -qw memory "/sys/fs/cgroup$v2/cgroup.controllers" 2>/dev/null &&
         [ -w "/sys/fs/cgroup$v2" ]; then
      base=/sys/fs/cgroup$v2 limit=memory.max
    fi
    [ -n "$base" ] || { echo "SKIP: no writable memory cgroup here"; exit 77; }
    cg=$base/starpipe-test-$$
    mkdir "$cg" 2>/dev/null || { echo "SKIP: cannot make a cgroup in $base"; exit 77; }
    trap 'pkill -f "$dir" 2>/dev/null; rmdir "$cg" 2>/dev/null; rm -rf "$dir"' EXIT
    echo 300000000 >"$cg/$limit" || { echo "SKIP: cannot set $limit"; exit 77; }
    (echo $BASHPID >"$cg/cgroup.procs" || exit 77
     refused 30 "needs .* of memory on this machine but .* is available \(the cgroup limit of $cg" \
       "$gpt" --batch 512 --context 256 --reference --steps 1) || exit $?
    echo "ok: a run past its cgroup's memory limit is refused before MPI" ;;
  # defect 8: a stale launcher variable does not silence a refusal
  launcher_stale)
    for v in PMI_RANK=1 PMIX_RANK=1 "SLURM_PROCID=1 SLURM_STEP_ID=0" "PMI_RANK=3 PMI_SIZE=2"; do
      refused 10 "unknown option '--bogus'" env $v "$gpt" --bogus
      refused 10 "is a directory" env $v "$mlp" --reference --steps 1 --save "$dir"
    done
    echo "ok: a single process with a stale launcher rank prints its refusal" ;;
  # defect 6: a signal during a save leaves no temporary and a loadable checkpoint
  sigterm_save)
    big="--layers 8 --channels 256 --heads 4 --context 16 --batch 1"
    for round in 1 2 3; do
      rm -f "$dir"/ck.st*
      $run2 "$gpt" $big --steps 1000 --save-every 1 --save "$dir/ck.st" >"$dir/out" 2>&1 &
      # as scancel does: SIGTERM to every task, the moment a save is seen being written
      # (a save takes tens of ms: seen, it is most likely still under way when the signal
      # lands; the old build left a temporary in every round)
      seen=0
      for i in $(seq 3000); do
        if ls "$dir"/ck.st.tmp.* >/dev/null 2>&1; then
          pkill -TERM -f "starpipe-gpt $big --steps 1000 --save-every 1 --save $dir/ck.st"
          seen=1
          break
        fi
        sleep 0.01
      done
      [ $seen = 1 ] || fail "round $round: no save was seen in progress"
      wait
      sleep 0.5
      if ls "$dir"/ck.st.tmp.* >/dev/null 2>&1; then ls -l "$dir"; fail "round $round: a temporary stayed"; fi
      if [ -e "$dir/ck.st" ]; then
        "$gpt" --reference --resume "$dir/ck.st" --steps 0 >"$dir/out" 2>&1 || fail "round $round: the checkpoint does not load"
      fi
    done
    echo "ok: SIGTERM during a save leaves no temporary; the last checkpoint loads" ;;
  # --save-on-signal: a resumed run is byte for byte an uninterrupted one
  save_on_signal)
    flags="$small --replicas 2 --microbatches 2 --lr-decay cosine --total-steps 150"
    $mpiexec -np 4 --oversubscribe "$gpt" $flags --save "$dir/full.st" >"$dir/out" 2>&1 || fail "uninterrupted run"
    $mpiexec -np 4 --oversubscribe "$gpt" $flags --save "$dir/ck.st" --save-on-signal USR1 \
      --log "$dir/l.jsonl" >"$dir/out" 2>&1 &
    for i in $(seq 400); do [ "$(cat "$dir/l.jsonl" 2>/dev/null | wc -l)" -ge 5 ] && break; sleep 0.05; done
    pid=$(pgrep -f "starpipe-gpt $flags --save $dir/ck.st" | tail -1)
    [ -n "$pid" ] || fail "no rank to signal"
    kill -USR1 "$pid"   # one rank only: the ranks agree
    wait $! || fail "the signalled run did not exit 0"
    line=$(grep "stopped by SIGUSR1 after step" "$dir/out") || fail "no 'stopped by' line"
    at=$(echo "$line" | sed 's/.*after step \([0-9]*\).*/\1/')
    [ "$at" -lt 150 ] || fail "the signal came after the last step ($at): nothing was tested"
    grep -q "^done: $at steps" "$dir/out" || fail "the done line does not say $at steps"
    $mpiexec -np 4 --oversubscribe "$gpt" --replicas 2 --resume "$dir/ck.st" --total-steps 150 --save "$dir/ck.st" \
      --save-on-signal USR1 >"$dir/out" 2>&1 || fail "resume"
    grep -q "^done: $((150 - at)) steps" "$dir/out" || fail "the resume did not run the $((150 - at)) steps left"
    cmp "$dir/full.st" "$dir/ck.st" || fail "stopped at step $at and resumed: not the uninterrupted run's bytes"
    # the reference interpreter, the same way
    "$gpt" $small --reference --total-steps 40 --save "$dir/rfull.st" >"$dir/out" 2>&1 || fail "reference run"
    "$gpt" $small --reference --total-steps 40 --save "$dir/r.st" --save-on-signal USR2 \
      --log "$dir/r.jsonl" >"$dir/out" 2>&1 &
    rp=$!
    for i in $(seq 400); do [ "$(cat "$dir/r.jsonl" 2>/dev/null | wc -l)" -ge 3 ] && break; sleep 0.02; done
    kill -USR2 $rp; wait $rp || fail "the signalled reference run did not exit 0"
    "$gpt" --reference --resume "$dir/r.st" --total-steps 40 --save "$dir/r.st" >"$dir/out" 2>&1 || fail "reference resume"
    cmp "$dir/rfull.st" "$dir/r.st" || fail "the reference, stopped and resumed, differs"
    echo "ok: stopped by a signal at step $at of 150 on one of 4 ranks, resumed: byte for byte the uninterrupted run" ;;
  signal_flags)
    refused 10 "--save-on-signal 'KILL': use USR1, USR2, TERM, INT or HUP" $run2 "$mlp" --save-on-signal KILL --save "$dir/a.st"
    refused 10 "--save-on-signal needs --save FILE" $run2 "$mlp" --save-on-signal USR1
    refused 10 "--steps counts this run's steps, --total-steps the step the run ends at" \
      "$mlp" --reference --steps 3 --total-steps 5
    "$mlp" --reference --total-steps 3 --save "$dir/a.st" >"$dir/out" 2>&1 && grep -q "^done: 3 steps" "$dir/out" ||
      fail "--total-steps 3 did not run 3 steps"
    "$mlp" --reference --resume "$dir/a.st" --total-steps 5 >"$dir/out" 2>&1 && grep -q "^done: 2 steps" "$dir/out" ||
      fail "--total-steps 5 after step 3 did not run 2 steps"
    "$mlp" --reference --resume "$dir/a.st" --total-steps 2 >"$dir/out" 2>&1 && grep -q "^done: 0 steps" "$dir/out" ||
      fail "--total-steps 2 after step 3 ran steps"
    # a signal during the last step stops nothing: the run is complete (no "stopped by",
    # which the README's job script would take for a reason to requeue)
    "$gpt" --layers 8 --channels 256 --heads 4 --context 128 --reference --steps 1 \
      --save "$dir/last.st" --save-on-signal USR1 >"$dir/out" 2>&1 &
    lp=$!
    for i in $(seq 1000); do grep -q "^resumed\|^throughput" "$dir/out" 2>/dev/null && break; sleep 0.01; done
    kill -USR1 $lp
    wait $lp || fail "a signal during the last step failed the run"
    ! grep -q "stopped by" "$dir/out" || fail "a signal during the last step said the run stopped"
    grep -q "^done: 1 steps" "$dir/out" || fail "the run did not complete its step"
    echo "ok: --save-on-signal and --total-steps checked like any flag" ;;
  *) echo "unknown case $case"; exit 2 ;;
esac
