# Sourced by the tests of this folder: cluster_up N [K] makes a cluster of N hosts
# (scripts/hosts; K: each host K cores of its own) and sets root, dir (a scratch folder),
# cluster (its directory) and name (its prefix); exits 77 where namespaces cannot be
# made. On exit, whatever runs on the hosts is thawed and killed, the hosts removed and
# the scratch folder too.
cluster_up() {
    local n=$1 k=${2:-} rc=0
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    dir=$(mktemp -d)
    cluster=$("$root/scripts/hosts" up "$n" $k) || rc=$?
    [[ $rc == 77 ]] && { rm -rf "$dir"; exit 77; }
    [[ $rc == 0 ]] || { rm -rf "$dir"; echo "FAIL: scripts/hosts up $n (exit $rc)"; exit 1; }
    name=$(cat "$cluster/name")
    trap cluster_down EXIT
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

cluster_down() {
    local i pids
    for ((i = 0; i < $(cat "$cluster/count"); i++)); do # a stopped process cannot die
        pids=$(ip netns pids "${name}h$i" 2>/dev/null || true)
        [[ -z $pids ]] || kill -CONT $pids 2>/dev/null || true
    done
    pkill -KILL -f "$cluster/hostfile" 2>/dev/null || true # this cluster's mpirun
    "$root/scripts/hosts" down "$cluster"
    rm -rf "$dir"
}
