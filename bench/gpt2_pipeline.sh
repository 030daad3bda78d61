#!/usr/bin/env bash
# bench/gpt2_pipeline.sh [BUILD] [ROUNDS]: GPT-2 124M's shape (12 layers, 12 heads, 768
# channels, vocabulary 50257, random init) on this machine: one process against 2 ranks
# under 1F1B, 1F1B+split (stage 1's backwards as B then W: the default) and ZB-H1, the
# default flags otherwise (the cut balanced by cost), at context 256 with 8 microbatches
# of one sequence and at llm.c's 4 x 64 tokens (4 microbatches of one sequence of 64).
# The data are the default text's bytes (token ids below 256 in a vocabulary of 50257:
# the same work as subword tokens). Rounds alternate the runs; each run's figure is its
# median step of steps 2..N, and a configuration's the lower of its rounds'. Prints step
# time, speed-up over one process, bubble and tokens per second.
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${2:-2}
APP=$BUILD/apps/starpipe-gpt
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
model="--vocab 50257 --layers 12 --heads 12 --channels 768 --batch 1"
shapes=("--context 256 --microbatches 8|4" "--context 64 --microbatches 4|6")
runs=("1|1f1b" "2|1f1b" "2|1f1b+split" "2|zb-h1")
# one run: "step_ms bubble% tok/s" (medians of steps 2..N) and the cut line
one() { # np schedule shape steps
    local np=$1 sched=$2 shape=$3 steps=$4 out
    # shellcheck disable=SC2086
    if [[ $np == 1 ]]; then out=$("$APP" --steps "$steps" $model $shape 2>&1)
    else out=$(mpirun -np "$np" "$APP" --steps "$steps" --schedule "$sched" $model $shape 2>&1); fi || {
        echo "$out" >&2
        echo "gpt2_pipeline.sh: the run failed" >&2
        exit 1
    }
    grep '^cut:' <<<"$out" >"$work/cut.$np" || true
    awk '/^step [0-9]+ / && $2 > 1 {
           for (i = 1; i < NF; i++) { if ($(i + 1) == "ms") ms = $i; if ($(i + 1) == "tok/s") tk = $i
                                      if ($i == "bubble") bb = $(i + 1) }
           print ms, bb, tk }' <<<"$out" | sort -g | awk '{ v[n] = $0; n++ } END { print v[int((n - 1) / 2)] }'
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
declare -A best
for ((r = 0; r < ROUNDS; r++)); do
    for sh in "${shapes[@]}"; do
        IFS='|' read -r shape steps <<<"$sh"
        for rn in "${runs[@]}"; do
            IFS='|' read -r np sched <<<"$rn"
            res=$(one "$np" "$sched" "$shape" "$steps")
            k="$shape|$np|$sched"
            if [[ -z ${best[$k]:-} ]] || awk -v a="${res%% *}" -v b="${best[$k]%% *}" 'BEGIN { exit !(a < b) }'; then
                best[$k]=$res
            fi
        done
    done
done
printf '%-32s %-28s %10s %9s %8s %8s\n' shape run "step (ms)" speed-up bubble "tok/s"
for sh in "${shapes[@]}"; do
    IFS='|' read -r shape steps <<<"$sh"
    base=${best[$shape|1|1f1b]%% *}
    for rn in "${runs[@]}"; do
        IFS='|' read -r np sched <<<"$rn"
        read -r ms bb tk <<<"${best[$shape|$np|$sched]}"
        label=$([[ $np == 1 ]] && echo "1 process" || echo "2 ranks $sched")
        [[ $np == 2 && $sched == 1f1b+split ]] && label+=" (default)"
        printf '%-32s %-28s %10s %8.2fx %8s %8s\n' "$shape" "$label" "$ms" \
            "$(awk -v a="$base" -v b="$ms" 'BEGIN { print a / b }')" "${bb:--}" "$tk"
    done
done
cat "$work/cut.2"
