#!/bin/sh
# eval_sample.sh MPIEXEC GPT MLP: evaluation (--eval-every) and sampling (--sample) of the
# apps, compared as printed. Eval lines print the loss with the digits that read back as
# the same float, so equal lines are equal bits.
#  1. The GPT pipelined on 2 ranks (1f1b) and on 4 ranks as 2 replicas of 2 actors
#     (interleaved-1f1b) prints the eval lines and the sample of a --reference run with
#     the same microbatches; --check passes with "(= reference)" on every eval line.
#  2. The MLP's eval lines on 2 ranks equal its reference's.
#  3. Sampling: the same seed gives the same bytes, --sample-seed another gives others;
#     --temperature 0 and --top-k 1 give the same (greedy) bytes; an empty prompt is
#     refused.
#  4. The held-out tail changes what is trained on, so --eval-every is a stored setting:
#     steps 1-4 in one run equal steps 1-2, save, then --resume alone for 3-4 (the eval
#     lines included); --steps 0 with --load evaluates the checkpoint.
#  5. Without --eval-every nothing is held out: the step losses do not move.
set -e
mpiexec=$1; gpt=$2; mlp=$3
# the sample runs to the end of the output: StarPU-MPI's statistics, which a user may ask
# for, would follow it there
unset STARPU_COMM_STATS
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
fail() { cat "$dir/log"; echo "FAIL: $*"; exit 1; }
small="--layers 4 --channels 16 --heads 2 --context 16 --batch 2"
ev="--eval-every 2 --eval-batches 4"
# run NAME NP APP FLAGS...: NP 0 is the reference interpreter; keeps the log as NAME.out
run() {
  name=$1; np=$2; app=$3; shift 3
  if [ "$np" = 0 ]; then "$app" --reference "$@" >"$dir/log" 2>&1 || fail "$name: the run failed"
  else "$mpiexec" -np "$np" --oversubscribe "$app" "$@" >"$dir/log" 2>&1 || fail "$name: the run failed"
  fi
  cp "$dir/log" "$dir/$name.out"
}
evals() { grep -a '^eval step' "$dir/$1.out" | sed 's/  (= reference)$//'; }
sample() { sed -n '/^sample (/,$p' "$dir/$1.out"; }
losses() { grep -a '^step ' "$dir/$1.out" | cut -d' ' -f1-4; }
# same FN A B MESSAGE: FN's view of runs A and B must be identical
same() {
  $1 "$2" >"$dir/a"; $1 "$3" >"$dir/b"
  cmp -s "$dir/a" "$dir/b" || { diff "$dir/a" "$dir/b"; echo "FAIL: $4"; exit 1; }
}

# 1. GPT: pipelined and replicated runs print the reference's evaluations and sample
run ref 0 "$gpt" $small $ev --steps 4 --microbatches 4 --sample 48
run p2 2 "$gpt" $small $ev --steps 4 --microbatches 4 --sample 48
run ref_r2 0 "$gpt" $small $ev --steps 3 --microbatches 4 --replicas 2 --actors 2 --sample 48
run r2 4 "$gpt" $small $ev --steps 3 --microbatches 4 --replicas 2 --schedule interleaved-1f1b \
  --sample 48
[ "$(evals ref | wc -l)" = 2 ] && [ "$(evals ref_r2 | wc -l)" = 2 ] || fail "eval lines: want steps 2 and 4 (or 3, the end)"
same evals ref p2 "2 ranks: eval lines differ from the reference"
same sample ref p2 "2 ranks: the sample differs from the reference"
same evals ref_r2 r2 "2 replicas: eval lines differ from the reference"
same sample ref_r2 r2 "2 replicas: the sample differs from the reference"
grep -aq "the last 3514 held out for evaluation" "$dir/p2.out" || fail "the split is not said"
run check 4 "$gpt" $small $ev --steps 2 --microbatches 4 --replicas 2 --check
[ "$(grep -ac '^eval step .*(= reference)$' "$dir/check.out")" = 1 ] || fail "--check: no eval line (= reference)"

# 2. the MLP: held-out rows from another stream of its generator
run mref 0 "$mlp" --eval-every 1 --steps 2 --microbatches 4 --actors 2
run m2 2 "$mlp" --eval-every 1 --steps 2 --microbatches 4 --schedule zb-h1
same evals mref m2 "MLP: eval lines differ from the reference"

# 3. sampling: seeded, greedy equals top-k 1
run s1 0 "$gpt" $small --steps 2 --sample 64 --prompt "The " --temperature 1.5
run s2 0 "$gpt" $small --steps 2 --sample 64 --prompt "The " --temperature 1.5
run s3 0 "$gpt" $small --steps 2 --sample 64 --prompt "The " --temperature 1.5 --sample-seed 7
run g1 0 "$gpt" $small --steps 2 --sample 64 --prompt "The " --temperature 0
run g2 0 "$gpt" $small --steps 2 --sample 64 --prompt "The " --top-k 1 --sample-seed 3
same sample s1 s2 "the same seed sampled different bytes"
[ "$(sample s1 | tail -n +2)" != "$(sample s3 | tail -n +2)" ] || fail "another seed sampled the same bytes"
[ "$(sample g1 | tail -n +2)" = "$(sample g2 | tail -n +2)" ] || fail "temperature 0 and top-k 1 differ"
[ "$(sample s1 | tail -n +2 | tr -d '\n' | wc -c)" -ge 64 ] || fail "fewer than 64 bytes sampled"
if "$gpt" --reference --steps 0 --sample 5 --prompt "" >"$dir/log" 2>&1; then fail "an empty prompt ran"; fi
grep -q "prompt needs at least one byte" "$dir/log" || fail "an empty prompt: no message"

# 4. resume: the stored settings keep the held-out split and the evaluations
run straight 2 "$gpt" $small $ev --steps 4 --microbatches 4
run half 2 "$gpt" $small $ev --steps 2 --microbatches 4 --save "$dir/half.st"
run rest 2 "$gpt" --resume "$dir/half.st" --steps 2
cat "$dir/half.out" "$dir/rest.out" > "$dir/joined.out"
same losses straight joined "the resumed run's steps differ from the straight run's"
same evals straight joined "the resumed run's evaluations differ from the straight run's"
run at0 2 "$gpt" --load "$dir/half.st" --steps 0 --eval-every 5
[ "$(evals at0)" = "$(evals half | tail -1)" ] || fail "--steps 0 does not evaluate the checkpoint"

# 5. without --eval-every the whole file is trained on: the same losses as before this
#    feature, which the held-out run must not have
run plain 0 "$gpt" $small --steps 3 --microbatches 4
run held 0 "$gpt" $small --steps 3 --microbatches 4 --eval-every 3
! grep -aq "held out" "$dir/plain.out" || fail "a run without evaluation holds data out"
[ "$(losses plain)" != "$(losses held)" ] || fail "holding out the tail changed nothing"
echo "ok: evaluations and samples equal the reference's (2 ranks, 2 replicas, MLP), seeded sampling, resume"
