#!/usr/bin/env bash
# bench/plan_fidelity.sh [--quick] [BUILD]: how well the planner predicts runs it did not
# see. One run of each model (the base: 2 actors, 1F1B, 4 microbatches) writes a profile
# (--profile); every configuration below, each different from its base, is run with
# --calibrate BASE_PROFILE, which prints the step time and the memory per rank the
# planner predicts from that profile before step 1, and the errors against the run's
# measured median step (steps 2..N) and memory per rank at the end. Ends with one line:
#   fidelity: N configurations, step time error median X% max Y%, memory error max Z%
# Three rounds, each profiling the bases afresh and then running every configuration
# against them: a configuration's error is the median of its three rounds' errors, so
# that the speed of this shared VM drifting between a profile and a run (it does, by
# tens of percent over minutes) counts once, not always. --quick: one round of fewer
# steps (a regular check, under a minute). Two ranks at most, so that every rank has a
# core of its own here (the model knows no oversubscription), launched as a user would:
# plain mpirun, which binds each rank to a core. (Unbound, --bind-to none, two ranks'
# workers and polling progress threads share the 2 cores as the kernel places them: about
# one run in three ran 20-40% off the schedule's bound, the whole run long, 2026-12-03.)
set -euo pipefail
quick=0
[[ ${1:-} == --quick ]] && { quick=1; shift; }
BUILD=${1:-build}
APPS=$BUILD/apps
[[ -x $APPS/starpipe-gpt && -x $APPS/starpipe-llama ]] || {
    echo "plan_fidelity.sh: no $APPS/starpipe-gpt or starpipe-llama: build first (make build)" >&2
    exit 2
}
steps=$((quick ? 6 : 16))
rounds=$((quick ? 1 : 3))
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# the bases run 16 steps even in --quick: every prediction of a round leans on them
base_args="--steps 16 --schedule 1f1b --microbatches 4"
run() { # ranks app args...: the run's output
    local np=$1 app=$2
    shift 2
    if [[ $np == 1 ]]; then "$APPS/$app" "$@"; else "${mpi[@]}" -np "$np" "$APPS/$app" "$@"; fi
}

profile_bases() {
    for model in gpt llama; do
        run 2 starpipe-$model $base_args --profile "$work/$model.profile" >"$work/$model.base" 2>&1 ||
            { cat "$work/$model.base" >&2; exit 1; }
    done
}

# ranks | app | arguments (never the base's own)
configs=(
"2|gpt|--schedule 1f1b --microbatches 2"
"2|gpt|--schedule 1f1b --microbatches 8"
"2|gpt|--schedule gpipe --microbatches 4"
"2|gpt|--schedule gpipe --microbatches 8"
"2|gpt|--schedule eager-1f1b --microbatches 4"
"2|gpt|--schedule zb-h1 --microbatches 4"
"2|gpt|--schedule zb-h1 --microbatches 8"
"2|gpt|--schedule interleaved-1f1b --chunks 2 --microbatches 4"
"2|gpt|--schedule interleaved-1f1b --chunks 2 --microbatches 8"
"2|gpt|--schedule zb-v --microbatches 4"
"2|gpt|--schedule dualpipe-v --microbatches 4"
"2|gpt|--schedule dualpipe-v --microbatches 8"
"2|gpt|--schedule 1f1b --microbatches 4 --stage-layers 3,1"
"2|gpt|--schedule 1f1b --microbatches 4 --stage-layers 1,3"
"2|gpt|--schedule 1f1b --microbatches 4 --recompute"
"2|gpt|--schedule zb-h1 --microbatches 8 --recompute"
"2|gpt|--schedule 1f1b --microbatches 4 --layers 8"
"2|gpt|--schedule gpipe --microbatches 8 --layers 8"
"2|gpt|--schedule 1f1b --microbatches 4 --batch 8"
"2|gpt|--schedule 1f1b --microbatches 8 --batch 2"
"2|gpt|--schedule 1f1b --microbatches 4 --tensor 2"
"2|gpt|--schedule 1f1b --microbatches 4 --replicas 2"
"2|gpt|--schedule 1f1b --microbatches 4 --replicas 2 --shard-optimizer"
"1|gpt|--schedule 1f1b --microbatches 4"
"2|llama|--schedule gpipe --microbatches 4"
"2|llama|--schedule 1f1b --microbatches 8"
"2|llama|--schedule zb-h1 --microbatches 8"
"2|llama|--schedule interleaved-1f1b --chunks 2 --microbatches 4"
"2|llama|--schedule dualpipe-v --microbatches 4"
"2|llama|--schedule zb-v --microbatches 8"
"2|llama|--schedule 1f1b --microbatches 4 --recompute"
"2|llama|--schedule 1f1b --microbatches 4 --tensor 2"
"2|llama|--schedule 1f1b --microbatches 4 --replicas 2"
)

measure() { # app np args: "predicted measured memory-error"
    local np=$1 app=$2 args=$3 out line
    # shellcheck disable=SC2086
    out=$(run "$np" starpipe-$app --steps $steps $args --calibrate "$work/$app.profile" 2>&1) || {
        echo "$out" >&2
        echo "plan_fidelity.sh: the run '$app $args' failed" >&2
        return 1
    }
    line=$(grep -E '^prediction: step .* predicted' <<<"$out") || {
        echo "$out" >&2
        echo "plan_fidelity.sh: no prediction line from '$app $args'" >&2
        return 1
    }
    sed -E 's/^prediction: step ([0-9.]+) ms predicted, ([0-9.]+) ms measured.*largest error ([-+0-9.]+)%.*/\1 \2 \3/' <<<"$line"
}
declare -a preds meass errs_r merr
for ((r = 0; r < rounds; r++)); do
    profile_bases
    for i in "${!configs[@]}"; do
        IFS='|' read -r np app args <<<"${configs[$i]}"
        read -r p m e < <(measure "$np" "$app" "$args") || exit 1
        preds[i]="${preds[i]:-} $p" meass[i]="${meass[i]:-} $m" merr[i]=$e
        errs_r[i]="${errs_r[i]:-} $(awk -v p="$p" -v m="$m" 'BEGIN { printf "%.4f", 100 * (p / m - 1) }')"
    done
done
med() { tr ' ' '\n' | grep . | sort -g | awk '{ v[n++] = $1 } END { print (n % 2) ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2 }'; }
printf '%-6s %-66s %10s %10s %8s %8s  %s\n' model configuration predicted measured error memory \
    "rounds' errors"
errs=()
merrs=()
for i in "${!configs[@]}"; do
    IFS='|' read -r np app args <<<"${configs[$i]}"
    err=$(med <<<"${errs_r[i]}")
    printf '%-6s %-66s %7.1f ms %7.1f ms %+7.1f%% %7s%%  %s\n' "$app" "ranks $np $args" \
        "$(med <<<"${preds[i]}")" "$(med <<<"${meass[i]}")" "$err" "${merr[i]}" \
        "$(for e in ${errs_r[i]}; do printf '%+.1f ' "$e"; done)"
    errs+=("$err")
    merrs+=("${merr[i]}")
done
python3 - "${#errs[@]}" "${errs[@]}" "${merrs[@]}" <<'EOF'
import statistics, sys
n = int(sys.argv[1])
e = [abs(float(x)) for x in sys.argv[2:2 + n]]
m = [abs(float(x)) for x in sys.argv[2 + n:]]
print(f"fidelity: {n} configurations, step time error median {statistics.median(e):.1f}% "
      f"max {max(e):.1f}%, memory error max {max(m):.1f}%")
EOF
