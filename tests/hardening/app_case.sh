#!/bin/sh
# app_case.sh MPIEXEC GPT MLP PLAN POKE CASE [VAR VALUE]: one hardening case of the apps
# end to end (case "env" sets VAR to VALUE, which must be refused; EMPTY: the empty string).
# A "refused" case passes when the command exits non-zero within its limit, prints the
# expected message on stderr as exactly one error line (one rank speaks), and printed no
# "step N" line (refused before any work). The other cases check files byte for byte.
mpiexec=$1 gpt=$2 mlp=$3 plan=$4 poke=$5 case=$6
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
run2="$mpiexec -np 2 --oversubscribe"
small="--layers 2 --channels 16 --heads 2 --context 16"
. "$(dirname "$0")/refused.sh" # fail, refused

case $case in
  # 1. special files as outputs and inputs
  save_fifo) mkfifo "$dir/f"; refused 20 "is a FIFO" $run2 "$mlp" --steps 2 --save "$dir/f"
             [ -p "$dir/f" ] || fail "the FIFO was replaced" ;;
  save_device) mknod "$dir/d" c 1 3 || { echo "SKIP: mknod needs root"; exit 77; }
               refused 20 "is a character device" $run2 "$mlp" --steps 2 --save "$dir/d"
               [ -c "$dir/d" ] || fail "the device node was replaced" ;;
  save_dir) mkdir "$dir/sub"; refused 20 "is a directory" $run2 "$mlp" --steps 2 --dump-grads "$dir/sub"
            [ -d "$dir/sub" ] || fail "the directory was replaced" ;;
  save_unwritable) refused 20 "cannot write --save file '$dir/no/such/dir/x.st'" \
                     $run2 "$mlp" --steps 2 --save "$dir/no/such/dir/x.st" ;;
  save_unwritable_reference) refused 20 "cannot write --save file" \
                               "$gpt" $small --reference --steps 2 --save "$dir/no/x.st" ;;
  trace_fifo) mkfifo "$dir/t"; export STARPIPE_TRACE="$dir/t"; refused 20 "STARPIPE_TRACE file .* is a FIFO" \
                $run2 -x STARPIPE_TRACE "$mlp" --steps 2
              [ -p "$dir/t" ] || fail "the FIFO was replaced" ;;
  trace_svg_dir) mkdir "$dir/t.json.svg"; export STARPIPE_TRACE="$dir/t.json"; refused 20 "picture .* is a directory" \
                   $run2 -x STARPIPE_TRACE "$mlp" --steps 2 ;;
  save_link_to_fifo) mkfifo "$dir/f"; ln -s f "$dir/l"
                     refused 20 "symbolic link to a FIFO" $run2 "$mlp" --steps 2 --save "$dir/l"
                     [ -p "$dir/f" ] && [ -L "$dir/l" ] || fail "the FIFO or the link changed" ;;
  save_link) echo old >"$dir/real"; ln -s real "$dir/l"
             "$mlp" --reference --steps 1 --save "$dir/l" >"$dir/out" 2>&1 || fail "the run failed"
             [ -L "$dir/l" ] || fail "the link became a regular file"
             "$mlp" --reference --steps 1 --load "$dir/real" >"$dir/out" 2>&1 || fail "the linked file is no checkpoint"
             echo "ok: a link to a regular file is followed and stays a link" ;;
  data_fifo) mkfifo "$dir/f"; refused 20 "data file .* is a FIFO" $run2 "$gpt" $small --data "$dir/f" ;;
  data_zero) refused 20 "data file '/dev/zero' is a character device" $run2 "$gpt" $small --data /dev/zero ;;
  schedule_fifo) mkfifo "$dir/f"; refused 20 "schedule file .* is a FIFO" $run2 "$mlp" --schedule "file:$dir/f" ;;
  load_urandom) refused 20 "/dev/urandom: not a regular file" $run2 "$mlp" --load /dev/urandom ;;
  # 3. a schedule is text to its last byte
  schedule_nul)
    printf 'actors 2\nstages 2\nmicrobatches 2\nactor 0: F(0,0) F(1,0) BW(0,0) BW(1,0)\nactor 1: F(0,1) BW(0,1) F(1,1) BW(1,1)\n\000actor 0: F(9,9)\n' >"$dir/s"
    refused 20 "s:6: a NUL byte" $run2 "$mlp" --schedule "file:$dir/s" ;;
  # 4. variables are input too
  env)
    var=$7 val=$8; [ "$val" = EMPTY ] && val=
    export "$var=$val"
    refused 20 "$var" $run2 -x "$var" "$mlp" --steps 1 ;;
  # 5. a checkpoint belongs to one model; a resume continues the run
  ckpt_heads)
    "$gpt" $small --reference --steps 1 --save "$dir/h2.st" >"$dir/out" 2>&1 || fail "the run failed"
    refused 20 "another model: heads=2 there, heads=4 in this run" \
      $run2 "$gpt" --layers 2 --channels 16 --heads 4 --context 16 --load "$dir/h2.st" ;;
  resume_no_flags)
    flags="$small --batch 3 --microbatches 3 --lr 0.002 --seed 7"
    $run2 "$gpt" $flags --steps 3 --save "$dir/straight.st" >"$dir/out" 2>&1 || fail "straight run"
    $run2 "$gpt" $flags --steps 2 --save "$dir/half.st" >"$dir/out" 2>&1 || fail "first half"
    $run2 "$gpt" --resume "$dir/half.st" --steps 1 --save "$dir/resumed.st" >"$dir/out" 2>&1 || fail "resume"
    grep -q "3 microbatches" "$dir/out" || fail "the microbatch count was not restored"
    ! grep -q "changed settings" "$dir/out" || fail "a change reported where there is none"
    cmp "$dir/straight.st" "$dir/resumed.st" || fail "the resumed run differs from the straight run"
    $run2 "$gpt" --resume "$dir/half.st" --steps 1 --lr 0.003 >"$dir/out" 2>&1 || fail "resume with --lr"
    [ "$(grep -c 'changed settings: --lr 0.003 (was 0.002)' "$dir/out")" -eq 1 ] ||
      fail "the change of --lr is not said in one line"
    echo "ok: --resume alone continues the run byte for byte; a change is said once" ;;
  # 6. sizes the parsers accept end in a message before StarPU starts, never in a signal
  size_tensor) refused 20 "parameter 'h0.attn.w' .* over the limit .* lower --channels" \
                 $run2 "$gpt" --layers 1024 --channels 65536 ;;
  size_memory) refused 30 "needs .* of memory .* lower --channels or --layers" \
                 $run2 "$gpt" --layers 64 --channels 16384 ;;
  size_memory_reference) refused 30 "needs .* of memory .* lower --width, --depth or --in" \
                           "$mlp" --reference --depth 4096 --width 32768 ;;
  size_mlp_input) refused 20 "input 'x' .* over the limit" $run2 "$mlp" --in 1048576 --batch 4096 ;;
  # 7. machine-readable output is valid: non-finite input refused, no nan/inf printed
  json_nonfinite)
    for c in F=nan B=inf lat=nan bw=-inf W=1e300; do
      "$plan" --schedule 1f1b --actors 2 --json --cost "$c" >"$dir/out" 2>"$dir/err" && fail "--cost $c accepted"
      ! grep -Eqi 'nan|inf' "$dir/out" || fail "--cost $c: nan or inf in the JSON"
    done
    "$plan" --schedule 1f1b --actors 2 --json --cost bw=1e-200 >"$dir/out" 2>"$dir/err" && fail "bw=1e-200 accepted"
    grep -q '"valid":false' "$dir/out" || fail "no JSON refusal for bw=1e-200"
    ! grep -Eqi 'nan|inf[^a-z]' "$dir/out" || fail "nan or inf in the refusal"
    "$plan" --schedule 1f1b --actors 2 --json --cost F=1e99 --trace "$dir/t.json" >"$dir/out" || fail "a large finite cost"
    ! grep -Eqi 'nan|inf' "$dir/out" "$dir/t.json" || fail "nan or inf in valid output"
    echo "ok: non-finite costs refused, JSON and traces finite" ;;
  # 8. exact values stay exact through a 2-rank load and save
  exact_values)
    "$gpt" $small --reference --steps 1 --save "$dir/a.st" >"$dir/out" 2>&1 || fail "the run failed"
    "$poke" "$dir/a.st" "$dir/special.st" || fail "ckpt_poke"
    ! cmp -s "$dir/a.st" "$dir/special.st" || fail "ckpt_poke changed nothing"
    $run2 "$gpt" --resume "$dir/special.st" --steps 0 --save "$dir/back.st" >"$dir/out" 2>&1 || fail "load and save"
    grep -q "2 actors.*resumed\|resumed from" "$dir/out" || fail "nothing was loaded"
    cmp "$dir/special.st" "$dir/back.st" || fail "-0.0, denormals or FLT_MAX changed through load and save"
    echo "ok: -0.0, denormals and FLT_MAX survive a 2-rank load and save" ;;
  # 9. defects of issue 27
  log_eval)
    # the eval loss of a step is in its --log line, as printed; no other line has one
    for how in pipelined reference; do
      if [ $how = pipelined ]; then cmd="$run2 $gpt"; else cmd="$gpt --reference"; fi
      $cmd $small --steps 5 --eval-every 2 --log "$dir/log.jsonl" >"$dir/out" 2>&1 || fail "$how run"
      for s in 1 2 3 4 5; do
        printed=$(sed -n "s/^eval step $s loss \([^ ]*\) .*/\1/p" "$dir/out")
        line=$(grep "^{\"step\":$s," "$dir/log.jsonl") || fail "$how: no log line of step $s"
        logged=$(echo "$line" | sed -n 's/.*"eval_loss":\([^,}]*\).*/\1/p')
        case $s in 2|4|5) [ -n "$printed" ] || fail "$how: no eval printed at step $s" ;;
                   *) [ -z "$printed" ] || fail "$how: an eval printed at step $s" ;; esac
        [ "$printed" = "$logged" ] || fail "$how: step $s: eval loss printed '$printed', logged '$logged'"
      done
    done
    echo "ok: eval_loss logged on the steps of an evaluation, as printed, and on no other" ;;
  data_format)
    # a shard of 2000 tokens 'a' whose magic is damaged (20240520 is 88 d8 34 01 in hex, little-endian)
    { printf '\210\331\064\001\001\000\000\000\320\007\000\000'; head -c 1012 /dev/zero
      yes a | head -n 2000 | tr '\n' '\000'; } >"$dir/bad.bin"
    refused 20 "data file '$dir/bad.bin' is neither UTF-8 text nor a token shard .*magic 20240520" \
      $run2 "$gpt" $small --steps 1 --data "$dir/bad.bin"
    head -c 5000 /dev/urandom >"$dir/rand.bin"
    refused 20 "'$dir/rand.bin' is neither UTF-8 text nor a token shard" \
      "$gpt" $small --reference --steps 1 --data "$dir/rand.bin"
    # said to be raw bytes, it trains on them
    "$gpt" $small --reference --steps 1 --data-format raw --data "$dir/bad.bin" >"$dir/out" 2>&1 ||
      fail "--data-format raw refused the file"
    grep -q "^step 1 " "$dir/out" && grep -q "(5024 bytes)" "$dir/out" || fail "--data-format raw did not train on the bytes"
    # text and shard say which one is meant
    refused 20 "--data-format shard: .*GPL-3.* magic" $run2 "$gpt" $small --steps 1 --data-format shard
    { printf '\210\330\064\001'; dd if="$dir/bad.bin" bs=4 skip=1 status=none; } >"$dir/good.bin"
    refused 20 "--data-format text: .*good.bin' is a token shard" \
      $run2 "$gpt" $small --steps 1 --data-format text --data "$dir/good.bin"
    refused 20 "--data-format raw: .*good.bin' is a token shard" \
      "$gpt" $small --reference --steps 1 --data-format raw --data "$dir/good.bin"
    refused 20 "--data-format: starpipe-mlp reads no data file" "$mlp" --reference --data-format raw
    refused 20 "--data-format 'bytes': use auto, text, shard or raw" $run2 "$gpt" --data-format bytes
    "$gpt" $small --reference --steps 1 --data "$dir/good.bin" >"$dir/out" 2>&1 && grep -q "2000 tokens in 1 shard" "$dir/out" ||
      fail "the repaired shard does not train"
    echo "ok: a damaged shard or binary data refused naming the file; --data-format raw trains on the bytes" ;;
  data_empty_entry)
    { printf '\210\330\064\001\001\000\000\000\320\007\000\000'; head -c 1012 /dev/zero
      yes a | head -n 2000 | tr '\n' '\000'; } >"$dir/a.bin"
    refused 20 "token shards '$dir/a.bin,,': entry 2 is empty" $run2 "$gpt" $small --steps 1 --data "$dir/a.bin,,"
    refused 20 "token shards ',$dir/a.bin': entry 1 is empty" "$gpt" $small --reference --steps 1 --data ",$dir/a.bin"
    echo "ok: a shard list with an empty entry is refused" ;;
  warmup_horizon)
    refused 20 "--warmup 10 ends after the decay's horizon, step 5 \(--decay-steps\)" \
      $run2 "$mlp" --steps 1 --warmup 10 --lr-decay cosine --decay-steps 5
    refused 20 "--warmup 10 ends after the decay's horizon, step 5 \(the run's last step" \
      "$mlp" --reference --steps 5 --warmup 10 --lr-decay linear
    "$mlp" --reference --steps 1 --warmup 5 --lr-decay cosine --decay-steps 5 >"$dir/out" 2>&1 ||
      fail "a warmup that ends at the horizon refused"
    "$mlp" --reference --steps 1 --warmup 10 >"$dir/out" 2>&1 || fail "a warmup without decay refused"
    echo "ok: a warmup past the decay's horizon is refused" ;;
  trace_svg_ms)
    export STARPIPE_TRACE="$dir/t.json"
    $run2 -x STARPIPE_TRACE "$mlp" --steps 2 >"$dir/out" 2>&1 || fail "the traced run failed"
    title=$(grep -o 'microbatches: step [^<]*' "$dir/t.json.svg") || fail "no title in the picture"
    echo "$title" | grep -Eq '^microbatches: step [0-9.]+ ms, bubble [0-9.]+%$' || fail "title '$title' has no ms"
    ms=$(echo "$title" | sed 's/.*step \([0-9.]*\) ms.*/\1/')
    # the same span as the trace's last event ends (its times in microseconds)
    end=$(grep -o '"ts":[0-9.e+-]*,"dur":[0-9.e+-]*' "$dir/t.json" | tr ':,' '  ' |
          awk '{ if ($2 + $4 > m) m = $2 + $4 } END { printf "%.6f", m / 1000 }')
    awk -v a="$ms" -v b="$end" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b > 0 && d <= 1e-3 * b) }' ||
      fail "the picture's step of $ms ms is not the trace's $end ms"
    echo "ok: the picture's title says $ms ms (the trace ends at $end ms)" ;;
  *) echo "unknown case $case"; exit 2 ;;
esac
