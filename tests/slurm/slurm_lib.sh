# Sourced by the Slurm tests (tests/slurm/slurm.sh: one node; tests/hosts/hosts_slurm.sh:
# one slurmd per host of a scripts/hosts cluster). A real Slurm of our own, as root:
#
#   slurm_prepare      skips (77) without root or Slurm; reaps what killed runs left; makes
#                      $dir (/tmp/starpipe-slurm.<pid>.XXXXXX); starts munged with a fresh
#                      key; picks $ctld_port and $slurmd_port; exports SLURM_CONF
#   slurm_conf HOST ADDR TMPFS NODELINE...
#                      writes slurm.conf: slurmctld HOST at ADDR, partition "test" of the
#                      nodes given as slurm.conf NodeName lines, TmpFS (each node's own
#                      scratch, where PMIx keeps a step's files)
#                      (SlurmdTimeout: $slurmd_timeout, else 10 s)
#   slurm_start DAEMON ARGS...   a daemon in the foreground, stopped by slurm_cleanup
#                      (prefix with a command that enters a host: nsenter ... slurmd ...)
#   slurm_wait_idle N  until N nodes are idle (20 s at most)
#   slurm_wait_job JOB [SECONDS]  until the job leaves PENDING/RUNNING; sets $state
#   slurm_cleanup      cancels the jobs, stops the daemons and what they started, removes
#                      $dir; the caller traps it on EXIT
#   run CMD...         a client command marked as this run's; fail MSG: the logs, exit 1
#
# Every daemon and client carries SP_SLURM_TEST=$dir in its environment (the jobs' tasks
# inherit it), and slurmstepd, which starts with an empty environment, holds files open in
# $dir: the cleanup stops exactly those processes, and a later run reaps what a run killed
# with SIGKILL left behind (the pid in the folder's name is gone).

slurm_marked() { # "pid owner folder" of each such process (of owner $1 only, when given)
  python3 - "${1:-}" $$ <<'PY'
import os, re, sys
want, me = sys.argv[1], sys.argv[2]
pat = re.compile(rb"/tmp/starpipe-slurm\.([0-9]+)\.[A-Za-z0-9]+")
for pid in filter(str.isdigit, os.listdir("/proc")):
    if pid == me: continue
    try:
        if open(f"/proc/{pid}/stat", "rb").read().rsplit(b")", 1)[1].split()[0] == b"Z":
            continue  # ended, not yet reaped
        m = None
        for v in open(f"/proc/{pid}/environ", "rb").read().split(b"\0"):
            if v.startswith(b"SP_SLURM_TEST="): m = pat.match(v[14:])
        for fd in ([] if m else os.listdir(f"/proc/{pid}/fd")):
            try: m = pat.match(os.readlink(f"/proc/{pid}/fd/{fd}").encode())
            except OSError: pass
            if m: break
    except (OSError, IndexError):
        continue
    if m and (not want or m.group(1).decode() == want):
        print(pid, m.group(1).decode(), m.group(0).decode())
PY
}

slurm_cleanup() {
  if [ -f "${dir:-}/slurm.conf" ]; then
    SLURM_CONF=$dir/slurm.conf timeout 5 scancel --full --quiet --state=PENDING,RUNNING \
      --partition=test 2>/dev/null
  fi
  # slurmd and slurmctld end their steps and helpers on SIGTERM; then whatever is left
  local p i=0
  for p in "${slurm_pids[@]}"; do kill "$p" 2>/dev/null; done
  while [ $i -lt 50 ] && [ -n "$(slurm_marked "$$")" ]; do sleep 0.1; i=$((i + 1)); done
  slurm_marked "$$" | while read -r p _; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  [ -z "${dir:-}" ] || rm -rf "$dir"
}

fail() {
  echo "FAIL: $1"
  local f
  for f in "$dir"/*.log "$dir"/run-*.out; do [ -f "$f" ] && { echo "--- $f"; tail -n 20 "$f"; }; done
  exit 1
}
run() { SP_SLURM_TEST=$dir "$@"; }
slurm_start() { SP_SLURM_TEST=$dir "$@" >/dev/null 2>&1 & slurm_pids+=($!); }
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

slurm_prepare() {
  local b i
  [ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root to start slurmctld, slurmd and munged"; exit 77; }
  for b in munged slurmctld slurmd srun sbatch scontrol scancel sinfo python3; do
    command -v "$b" >/dev/null ||
      { echo "SKIP: no $b (scripts/install-deps installs slurm-wlm and munge)"; exit 77; }
  done
  # leftovers of runs whose test process is gone
  slurm_marked | while read -r pid owner d; do
    if ! kill -0 "$owner" 2>/dev/null; then
      echo "reaping pid $pid left by an earlier run ($d)"; kill -9 "$pid" 2>/dev/null; rm -rf "$d"
    fi
  done
  dir=$(mktemp -d /tmp/starpipe-slurm.$$.XXXXXX)
  slurm_pids=()
  # Only this run's launcher variables: a test run inside a Slurm job or under mpirun must
  # not hand its own to the jobs.
  for b in $(env | sed -n 's/^\(\(SLURM\|PMIX\|PMI\)_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$b"; done
  unset OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export SLURM_CONF=$dir/slurm.conf
  # munge: its own key, socket, pid, log and seed files (-f: the folder is under /tmp); a
  # socket by path, so that the hosts of a scripts/hosts cluster reach it too
  mkdir -p "$dir/munge" "$dir/state"
  head -c 1024 /dev/urandom >"$dir/munge/key" && chmod 400 "$dir/munge/key"
  slurm_start munged -F -f --key-file="$dir/munge/key" --socket="$dir/munge/socket" \
    --pid-file="$dir/munge/pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed"
  i=0
  until [ -S "$dir/munge/socket" ]; do
    sleep 0.1; i=$((i + 1)); [ $i -lt 50 ] || fail "munged did not start in 5 s"
  done
  # two free ports (a host's own network has every port free)
  read -r ctld_port slurmd_port < <(python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')
}

slurm_conf() {
  local host=$1 addr=$2 tmpfs=$3 line nodes=""
  shift 3
  {
    cat <<EOF
ClusterName=starpipe-test
SlurmctldHost=$host($addr)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
TmpFS=$tmpfs
FirstJobId=$(( $$ % 100000 * 10 + 1 ))
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
PlugStackConfig=$dir/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
KillWait=2
MessageTimeout=10
SlurmdTimeout=${slurmd_timeout:-10}
EOF
    for line in "$@"; do
      echo "$line"
      nodes+="${nodes:+,}$(sed 's/^NodeName=\([^ ]*\).*/\1/' <<<"$line")"
    done
    echo "PartitionName=test Nodes=$nodes Default=YES MaxTime=5 State=UP"
  } >"$dir/slurm.conf"
  : >"$dir/plugstack.conf"
}

slurm_wait_idle() {
  local n=$1 i=0
  until [ "$(timeout 5 sinfo -h -N -o %t 2>/dev/null | grep -c '^idle$')" = "$n" ]; do
    sleep 0.2; i=$((i + 1)); [ $i -lt 100 ] || fail "$n nodes did not come up idle in 20 s"
  done
}

slurm_wait_job() {
  local job=$1 limit=${2:-120} i=0
  state=
  while :; do
    state=$(timeout 5 scontrol -o show job "$job" 2>/dev/null)
    case $state in *JobState=PENDING*|*JobState=RUNNING*|*JobState=CONFIGURING*|*JobState=COMPLETING*|"") ;; *) break ;; esac
    sleep 0.2; i=$((i + 1)); [ $i -lt $((limit * 5)) ] || fail "job $job not done in $limit s"
  done
}
