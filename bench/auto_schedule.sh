#!/usr/bin/env bash
# bench/auto_schedule.sh [BUILD]: --schedule auto against every built-in, measured. For each
# configuration (2 ranks), every schedule runs in two alternating rounds of 16 steps; a
# schedule's time is the lower of its two median steps (steps 2..16). auto's two probe
# steps before step 1 are not in its step time. Prints a table and auto's ratio to the
# best built-in of each configuration (an uneven cut of 2 stages: the one-stage-per-actor
# schedules only).
set -euo pipefail
BUILD=${1:-build}
APPS=$BUILD/apps
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
steps=16
scheds=(gpipe 1f1b eager-1f1b zb-h1 "interleaved-1f1b --chunks 2" zb-v dualpipe-v auto)
configs=(
"gpt|--microbatches 8"
"gpt|--microbatches 8 --stage-layers 1,3"
"gpt|--microbatches 8 --stage-layers 3,1"
"gpt|--microbatches 4 --layers 8"
"llama|--microbatches 8"
)
median_step() { # app args...: the median step of steps 2..N, ms
    local app=$1
    shift
    mpirun --oversubscribe -np 2 "$APPS/starpipe-$app" --steps $steps "$@" 2>&1 |
        awk '/^step [0-9]+ / && $2 > 1 { for (i = 1; i < NF; i++) if ($(i + 1) == "ms") print $i }' |
        sort -g | awk '{ v[n++] = $1 } END { if (!n) exit 1; print (n % 2) ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2 }'
}
declare -A best
for round in 1 2; do
    for c in "${configs[@]}"; do
        IFS='|' read -r app args <<<"$c"
        for s in "${scheds[@]}"; do
            # a cut of 2 stages does not fit the schedules of 2 stages per actor
            [[ $args == *stage-layers* && $s =~ interleaved|zb-v|dualpipe ]] && continue
            # shellcheck disable=SC2086
            t=$(median_step "$app" $args --schedule $s) || { echo "auto_schedule.sh: $app $args --schedule $s failed" >&2; exit 1; }
            k="$c|$s"
            if [[ -z ${best[$k]:-} ]] || awk -v a="$t" -v b="${best[$k]}" 'BEGIN { exit !(a < b) }'; then
                best[$k]=$t
            fi
        done
    done
done
printf '%-6s %-36s' model configuration
for s in "${scheds[@]}"; do printf ' %10s' "${s%% *}"; done
printf ' %12s\n' "auto/best"
for c in "${configs[@]}"; do
    IFS='|' read -r app args <<<"$c"
    printf '%-6s %-36s' "$app" "$args"
    b=""
    for s in "${scheds[@]}"; do
        t=${best[$c|$s]:-}
        printf ' %10s' "${t:--}"
        [[ -n $t ]] || continue
        if [[ $s != auto ]] && { [[ -z $b ]] || awk -v a="$t" -v b="$b" 'BEGIN { exit !(a < b) }'; }; then b=$t; fi
    done
    awk -v a="${best[$c|auto]}" -v b="$b" 'BEGIN { printf " %11.3fx\n", a / b }'
done
