#!/bin/sh
# calibrate_app.sh MPIEXEC APP: --profile and --calibrate as a user runs them. A run on 2
# ranks writes a profile; in it, every task the run timed has its program's ops, each
# timed, adding up to the task (the op clock's shares of the trace's median, from the
# rank that ran them: a program missing or timed on the wrong rank shows here). Other runs predict from it: the memory each rank allocates
# (sp_trainer_memory) equals the prediction to the byte (the planner's pool, slabs,
# scratch and transfer buffers), under 1F1B, ZB-H1 with recomputation, two replicas
# with ZeRO-1 and T = 2; the step time is printed, not judged (the machine is shared:
# bench/plan_fidelity.sh measures it). --schedule auto (measured or calibrated) writes the
# reference's files. Bad input: one message, exit 2, nothing written.
set -e
mpiexec=$1; app=$2
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
"$mpiexec" -np 2 "$app" --steps 4 --profile "$dir/p.txt" >"$dir/log" 2>&1 || { cat "$dir/log"; exit 1; }
head -1 "$dir/p.txt" | grep -qx 'starpipe-profile 1' || { echo "FAIL: header"; head -3 "$dir/p.txt"; exit 1; }
# the default cut, said once (the small GPT's head is light: the even cut)
[ "$(grep -c "^cut: blocks per stage 2,2 (balanced by the programs' FLOPs" "$dir/log")" = 1 ] ||
  { cat "$dir/log"; echo "FAIL: the cut line"; exit 1; }
awk '$1 == "task" || $1 == "op" { split($2, s, "="); split($3, k, "="); key = s[2] " " k[2]
       for (i = 2; i <= NF; i++) if ($i ~ /^seconds=/) { split($i, v, "="); x = v[2] }
       if ($1 == "task") task[key] = x; else { ops[key] += x; if (x <= 0) { print "FAIL: untimed op: " $0; bad = 1 } } }
     END { n = 0
       for (key in task) { n++; r = ops[key] / task[key]
         if (r < 0.99 || r > 1.01) { print "FAIL: stage/kind " key ": ops sum " ops[key] " s, task " task[key] " s"; bad = 1 } }
       if (n < 4) { print "FAIL: " n " task lines"; bad = 1 }
       exit bad }' "$dir/p.txt"
grep -q '^link kind=allreduce ranks=2 bytes=' "$dir/p.txt" || { echo "FAIL: no link probe"; exit 1; }
# every AdamW task of a stage is in its update time: with a vocabulary of 50257 the tied
# wte (3.2M floats, updated in a task of its own before the rest) is 98% of stage 0's
# update, which must then take far longer than with a vocabulary of 256
for v in 256 50257; do
  "$mpiexec" -np 2 "$app" --steps 4 --layers 2 --vocab $v --profile "$dir/u$v.txt" >"$dir/log" 2>&1 ||
    { cat "$dir/log"; exit 1; }
done
u0=$(awk '$1 == "update" && $2 == "stage=0" { split($3, x, "="); print x[2] }' "$dir/u256.txt")
u1=$(awk '$1 == "update" && $2 == "stage=0" { split($3, x, "="); print x[2] }' "$dir/u50257.txt")
awk -v a="$u0" -v b="$u1" 'BEGIN { exit !(a > 0 && b > 5 * a) }' ||
  { echo "FAIL: stage 0's update took $u1 s with the large vocabulary, $u0 s with 256"; exit 1; }
# the caches' probe (13 sizes, ascending), and a reuse factor for every task timed, ahead
# of the ops (whose times the reader takes them out of)
[ "$(grep -c '^cache bytes=[0-9]* seconds_per_byte=' "$dir/p.txt")" = 13 ] ||
  { grep '^cache' "$dir/p.txt"; echo "FAIL: the cache probe"; exit 1; }
[ "$(grep -c '^reuse stage=' "$dir/p.txt")" = "$(grep -c '^task stage=' "$dir/p.txt")" ] &&
  [ "$(grep -n -m1 '^op ' "$dir/p.txt" | cut -d: -f1)" -gt "$(grep -n '^reuse ' "$dir/p.txt" | tail -1 | cut -d: -f1)" ] ||
  { grep -n '^reuse\|^task' "$dir/p.txt"; echo "FAIL: reuse records"; exit 1; }
for args in "--schedule 1f1b --microbatches 8" "--schedule zb-h1 --recompute --layers 6" \
            "--replicas 2 --shard-optimizer" "--tensor 2"; do
  # shellcheck disable=SC2086
  "$mpiexec" -np 2 "$app" --steps 3 $args --calibrate "$dir/p.txt" >"$dir/log" 2>&1 || { cat "$dir/log"; exit 1; }
  grep -q '^prediction: step .* ms (pipeline' "$dir/log" || { cat "$dir/log"; echo "FAIL: $args: no prediction"; exit 1; }
  line=$(grep '^prediction: step .* predicted' "$dir/log") || { cat "$dir/log"; echo "FAIL: $args: no report"; exit 1; }
  echo "$args: $line"
  echo "$line" | grep -q 'memory per rank: largest error [-+]0\.0%' || { echo "FAIL: $args: memory"; exit 1; }
done
# starpipe-plan prices a shape on the profile's machine; a synthetic chain it refuses
plan=$(dirname "$app")/starpipe-plan
"$plan" --gpt 4,64,64,256,4 --actors 2 --schedule 1f1b --microbatches 4 --calibrate "$dir/p.txt" \
  >"$dir/log" 2>&1 || { cat "$dir/log"; echo "FAIL: starpipe-plan --calibrate"; exit 1; }
grep -q '^calibrated by .* GFLOP/s of the programs' "$dir/log" && grep -q '^step time ' "$dir/log" ||
  { cat "$dir/log"; echo "FAIL: starpipe-plan --calibrate said nothing"; exit 1; }
if "$plan" --actors 2 --schedule 1f1b --calibrate "$dir/p.txt" >"$dir/log" 2>&1; then
  echo "FAIL: starpipe-plan --calibrate without a shape exited 0"; exit 1
fi
grep -q -e '--calibrate prices a model given by its shape' "$dir/log" || { cat "$dir/log"; exit 1; }
# --schedule auto as users run it: files byte for byte against a --reference run, with the
# default launch, ranks unbound, the user's StarPU variables set, and costs from the profile
"$app" --reference --actors 2 --microbatches 6 --steps 2 --dump-grads "$dir/ref.grads" \
  --save "$dir/ref.ckpt" >"$dir/log" 2>&1 || { cat "$dir/log"; echo "FAIL: reference"; exit 1; }
for launch in "default" "--bind-to none" "env STARPU_WORKERS_NOBIND=1" "calibrated"; do
  flags=""; pre=""; extra=""
  case $launch in
    --bind*) flags=$launch ;;
    env*) pre=${launch#env } ;;
    calibrated) extra="--calibrate $dir/p.txt" ;;
  esac
  rm -f "$dir/run.grads" "$dir/run.ckpt"
  # shellcheck disable=SC2086
  env $pre "$mpiexec" -np 2 $flags "$app" --schedule auto --microbatches 6 --steps 2 $extra \
    --dump-grads "$dir/run.grads" --save "$dir/run.ckpt" >"$dir/log" 2>&1 ||
    { cat "$dir/log"; echo "FAIL: auto ($launch)"; exit 1; }
  grep -q '^schedule auto: for the task times' "$dir/log" || { cat "$dir/log"; echo "FAIL: auto ($launch) said nothing"; exit 1; }
  cmp "$dir/ref.grads" "$dir/run.grads" || { echo "FAIL: auto ($launch): gradients differ"; exit 1; }
  cmp "$dir/ref.ckpt" "$dir/run.ckpt" || { echo "FAIL: auto ($launch): checkpoint differs"; exit 1; }
done
grep '^schedule auto' "$dir/log"
# where two stages per actor are faster (8 layers, 8 microbatches: usually ZB-V), auto runs
# the model cut into 4 stages: the same bits as the reference's 2
"$app" --reference --actors 2 --microbatches 8 --layers 8 --steps 2 --dump-grads "$dir/ref.grads" \
  --save "$dir/ref.ckpt" >"$dir/log" 2>&1 || { cat "$dir/log"; echo "FAIL: reference"; exit 1; }
"$mpiexec" -np 2 "$app" --schedule auto --microbatches 8 --layers 8 --steps 2 \
  --dump-grads "$dir/run.grads" --save "$dir/run.ckpt" >"$dir/log" 2>&1 ||
  { cat "$dir/log"; echo "FAIL: auto (8 layers)"; exit 1; }
grep '^schedule auto' "$dir/log"
cmp "$dir/ref.grads" "$dir/run.grads" || { echo "FAIL: auto (8 layers): gradients differ"; exit 1; }
cmp "$dir/ref.ckpt" "$dir/run.ckpt" || { echo "FAIL: auto (8 layers): checkpoint differs"; exit 1; }
# bad input: a file that is not a profile; --profile on the reference; one step
# --link: the same run predicted over a slow link (1 MB/s: 64 KiB in 66 ms a message)
# is predicted slower by at least the messages of one actor's critical path, the
# profile's latency kept (its line says the bandwidth)
"$mpiexec" -np 2 "$app" --steps 2 --calibrate "$dir/p.txt" >"$dir/log" 2>&1 ||
  { cat "$dir/log"; exit 1; }
fast=$(sed -n 's/^prediction: step \([0-9.]*\) ms (pipeline.*/\1/p' "$dir/log")
"$mpiexec" -np 2 "$app" --steps 2 --calibrate "$dir/p.txt" --link 1e6 >"$dir/log" 2>&1 ||
  { cat "$dir/log"; exit 1; }
slow=$(sed -n 's/^prediction: step \([0-9.]*\) ms (pipeline.*/\1/p' "$dir/log")
grep -q '^prediction: step .* + bytes at 0.00 GB/s' "$dir/log" &&
  awk -v f="$fast" -v s="$slow" 'BEGIN { exit !(s > f + 4 * 65.5) }' ||
  { cat "$dir/log"; echo "FAIL: --link 1e6: step $slow ms predicted, $fast ms without"; exit 1; }
printf 'hello\n' >"$dir/bad.txt"
for args in "--calibrate $dir/bad.txt|bad.txt:1: not a starpipe profile" \
            "--calibrate $dir/none.txt|none.txt: cannot open" \
            "--reference --profile $dir/x.txt|--reference has no pipeline" \
            "--steps 1 --profile $dir/x.txt|--profile needs --steps 2 or more" \
            "--profile $dir/p.txt --calibrate $dir/p.txt|is the --calibrate file" \
            "--schedule auto --chunks 2|schedule auto places one stage per actor" \
            "--memory-cap 2|--memory-cap caps the schedule auto's activations" \
            "--link 1e8|--link prices the messages of --calibrate's prediction" \
            "--calibrate $dir/p.txt --link 0|--link expects a number" \
            "--calibrate $dir/p.txt --link 1e8,x|--link expects a number"; do
  a=${args%%|*}; want=${args#*|}
  set +e
  # shellcheck disable=SC2086
  "$mpiexec" -np 2 "$app" --steps 2 $a >"$dir/log" 2>&1; rc=$?
  set -e
  [ "$rc" -ne 0 ] || { cat "$dir/log"; echo "FAIL: '$a' exited 0"; exit 1; }
  n=$(grep -c -e "$want" "$dir/log" || true)
  [ "$n" = 1 ] || { cat "$dir/log"; echo "FAIL: '$a': $n lines saying '$want'"; exit 1; }
  [ ! -e "$dir/x.txt" ] || { echo "FAIL: '$a' wrote a profile"; exit 1; }
done
echo "ok: profile consistent, memory predicted to the byte, auto bitwise, bad input refused"
