#!/usr/bin/env bash
# bench/hosts_links.sh [--quick] [--tcp-defaults] [BUILD]: the planner against links like
# a cluster's. The runtime tunes Open MPI's TCP (eager limits and largest fragment at
# 129 KiB, 1 MiB socket buffers: a 64 KiB message goes eager; README, "Open MPI over TCP,
# tuned"); --tcp-defaults gives mpirun Open MPI's own values instead (64 KiB, 128 KiB,
# the kernel's buffers), for the comparison in bench/README.md. Two
# hosts on this machine (scripts/hosts, as root), one rank each, so that every pipeline
# message crosses the hosts' link; the link shaped by tc's token bucket (tbf) to each
# setting in turn, both ways, the ranks of a host untouched. A run on the unshaped link
# writes a profile (--profile: its tasks, ops, caches, the TCP link's latency); each
# setting's run predicts itself from that profile with the setting's bandwidth
# (--calibrate PROFILE --link BYTES_PER_S), and prints the prediction against its measured
# median step. Three rounds (one with --quick), alternating the settings, each with a
# fresh profile; the table gives the medians of the rounds. Exit 77 where hosts or tc
# cannot be made.
set -euo pipefail
quick=0 mca=()
[[ ${1:-} == --quick ]] && { quick=1; shift; }
if [[ ${1:-} == --tcp-defaults ]]; then
    shift
    mca=(--mca btl_tcp_eager_limit 65536 --mca btl_tcp_rndv_eager_limit 65536
           --mca btl_tcp_max_send_size 131072 --mca btl_tcp_sndbuf 0 --mca btl_tcp_rcvbuf 0)
fi
BUILD=${1:-build}
app=$BUILD/apps/starpipe-gpt
[[ -x $app ]] || { echo "hosts_links.sh: no $app: build first (make build)" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=$((quick ? 1 : 3))
steps=$((quick ? 8 : 24))
args=${HOSTS_LINKS_ARGS:-"--schedule 1f1b --microbatches 8"}
settings=(off 1gbit 300mbit 100mbit)
work=$(mktemp -d)
rc=0
cluster=$("$root/scripts/hosts" up 2 1) || rc=$? # a core of its own each
[[ $rc == 0 ]] || { rm -rf "$work"; exit "$rc"; }
trap '"$root/scripts/hosts" down "$cluster"; rm -rf "$work"' EXIT
"$root/scripts/hosts" link "$cluster" 1gbit || exit $? # tbf exists
"$root/scripts/hosts" link "$cluster" off
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() { # the app on 2 hosts, one rank each
    # shellcheck disable=SC2086
    timeout 600 "$cluster/mpirun" -np 2 --map-by node ${mca[@]+"${mca[@]}"} "$app" \
        --steps "$steps" $args "$@"
}
bytes_per_s() { # tc's rate as bytes per second
    echo $(($(numfmt --from=si "$(tr a-z A-Z <<<"${1%bit}")") / 8))
}
for ((r = 0; r < rounds; r++)); do
    "$root/scripts/hosts" link "$cluster" off
    run --profile "$work/p" >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
    for s in "${settings[@]}"; do
        "$root/scripts/hosts" link "$cluster" "$s"
        link=()
        [[ $s == off ]] || link=(--link "$(bytes_per_s "$s")")
        run --calibrate "$work/p" "${link[@]}" >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
        line=$(grep -E '^prediction: step .* predicted' "$work/log") || { cat "$work/log"; exit 1; }
        # predicted measured
        sed -E 's/^prediction: step ([0-9.]+) ms predicted, ([0-9.]+) ms measured.*/\1 \2/' \
            <<<"$line" >>"$work/$s"
    done
done
"$root/scripts/hosts" link "$cluster" off
printf '%-10s %12s %12s %8s   %s\n' link predicted measured error "rounds (predicted/measured ms)"
for s in "${settings[@]}"; do
    python3 - "$s" "$work/$s" <<'EOF'
import statistics, sys
name, rows = sys.argv[1], [tuple(map(float, l.split())) for l in open(sys.argv[2])]
p = statistics.median(r[0] for r in rows)
m = statistics.median(r[1] for r in rows)
e = statistics.median(100 * (r[0] / r[1] - 1) for r in rows)
print(f"{name:<10} {p:9.1f} ms {m:9.1f} ms {e:+7.1f}%   " +
      " ".join(f"{a:.1f}/{b:.1f}" for a, b in rows))
EOF
done
