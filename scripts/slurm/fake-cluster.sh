#!/usr/bin/env bash
# A fake Slurm cluster on this host, for tests and benchmarks: munged + slurmctld + slurmd with typed,
# typed GRES backed by empty files (no GPU devices: Slurm only counts them), all under one private folder.
#
#   scripts/slurm/fake-cluster.sh start DIR [GRES...]   # one GRES list per node n0, n1, ...
#       default: n0 gpu:v100:4,gpu:t4:2 and n1 gpu:v100:2,gpu:t4:2 (one slurmd per node, each on its own port)
#   JOB_SUBMIT_LUA=contrib/slurm/job_submit.lua scripts/slurm/fake-cluster.sh start DIR   # with the plugin
#   scripts/slurm/fake-cluster.sh stop DIR
#   export SLURM_CONF=DIR/etc/slurm.conf           # then sinfo, sbatch, squeue... talk to it
#
# Runs as the calling user (SlurmUser = that user). No cgroups, no accounting daemon: sacct is not
# available (AccountingStorageType=accounting_storage/none); ended jobs stay visible to squeue /
# scontrol for MinJobAge seconds and are logged by jobcomp/filetxt to DIR/log/jobcomp.txt.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [[ -z "$cmd" || -z "$dir" ]]; then
    echo "usage: $0 start|stop DIR [GRES...]" >&2
    exit 2
fi

need() {
    for b in "$@"; do
        if ! command -v "$b" >/dev/null 2>&1 && [[ ! -x "/usr/sbin/$b" ]]; then
            echo "error: $b not found: install slurm-wlm and munge (apt-get install slurm-wlm munge)" >&2
            exit 2
        fi
    done
}

bin() { command -v "$1" 2>/dev/null || echo "/usr/sbin/$1"; }

stop() {
    local pid
    for f in "$dir"/run/slurmd-*.pid "$dir"/run/slurmctld.pid "$dir"/run/munged.pid; do
        [[ -f "$f" ]] || continue
        pid=$(cat "$f" 2>/dev/null || true)
        if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -KILL "$pid" 2>/dev/null || true
        fi
        rm -f "$f"
    done
}

free_port() {
    python3 - <<'PY'
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()
PY
}

start() {
    need munged slurmctld slurmd sbatch
    shift 2
    local nodes_gres=("$@")
    if [[ ${#nodes_gres[@]} -eq 0 ]]; then nodes_gres=(gpu:v100:4,gpu:t4:2 gpu:v100:2,gpu:t4:2); fi
    mkdir -p "$dir"/{etc,run,log,spool/ctld,spool/d,munge}
    chmod 0700 "$dir"/munge "$dir"/run
    dir=$(cd "$dir" && pwd)
    local user host ctl_port
    user=$(id -un)
    host=$(hostname -s)
    ctl_port=$(free_port)
    # munge: a fresh key for this cluster only, its own socket
    if [[ ! -f "$dir/munge/munge.key" ]]; then
        head -c 1024 /dev/urandom >"$dir/munge/munge.key"
        chmod 0400 "$dir/munge/munge.key"
    fi
    "$(bin munged)" --force --socket="$dir/munge/munge.sock" --key-file="$dir/munge/munge.key" \
        --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed"
    # gres.conf: each typed GPU a fake device file (Slurm 22.05 drops file-less GPUs); Slurm only
    # counts them and sets CUDA_VISIBLE_DEVICES, nothing opens them.
    # Several slurmd on one host: each node its own port (Debian's 22.05 allows it).
    local gres_conf="" node_conf="" node_names=() gres_types=() next last k=0 node
    for gres in "${nodes_gres[@]}"; do
        node="n$k"
        node_names+=("$node")
        mkdir -p "$dir/dev/$node"
        next=0
        IFS=',' read -ra parts <<<"$gres"
        for p in "${parts[@]}"; do
            IFS=':' read -r name type count <<<"$p"
            last=$((next + count - 1))
            for i in $(seq "$next" "$last"); do : >"$dir/dev/$node/${name}$i"; done
            gres_conf+="NodeName=$node Name=$name Type=$type File=$dir/dev/$node/${name}[$next-$last]"$'\n'
            gres_types+=("$name")
            next=$((last + 1))
        done
        node_conf+="NodeName=$node NodeHostname=$host NodeAddr=127.0.0.1 Port=$(free_port) CPUs=64 RealMemory=1000"
        node_conf+=" Gres=$gres State=UNKNOWN"$'\n'
        k=$((k + 1))
    done
    printf '%s' "$gres_conf" >"$dir/etc/gres.conf"
    cat >"$dir/etc/cgroup.conf" <<CONF
CgroupPlugin=autodetect
CONF
    cat >"$dir/etc/slurm.conf" <<CONF
ClusterName=gpualloc-fake
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctl_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.sock
StateSaveLocation=$dir/spool/ctld
SlurmdSpoolDir=$dir/spool/d-%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
GresTypes=$(printf '%s\n' "${gres_types[@]}" | sort -u | paste -sd,)
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
# bf_interval=1: heterogeneous jobs (gangs with unequal GPUs per node) are started by backfill only
SchedulerParameters=sched_interval=1,bf_interval=1
MinJobAge=3600
MaxJobCount=100000
KillWait=5
InactiveLimit=0
SlurmdParameters=config_overrides
${node_conf}PartitionName=gpu Nodes=$(IFS=,; echo "${node_names[*]}") Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
    if [[ -n "${JOB_SUBMIT_LUA:-}" ]]; then  # the advisory plugin (contrib/slurm/job_submit.lua)
        cp "$JOB_SUBMIT_LUA" "$dir/etc/job_submit.lua"
        echo "JobSubmitPlugins=lua" >>"$dir/etc/slurm.conf"
    fi
    export SLURM_CONF="$dir/etc/slurm.conf"
    "$(bin slurmctld)" -i -f "$SLURM_CONF"
    for node in "${node_names[@]}"; do "$(bin slurmd)" -N "$node" -f "$SLURM_CONF"; done
    for _ in $(seq 100); do
        if [[ $(sinfo -h -N -o '%N %T' 2>/dev/null | grep -c ' idle$') -eq ${#node_names[@]} ]]; then
            echo "SLURM_CONF=$SLURM_CONF"
            return 0
        fi
        sleep 0.2
    done
    echo "error: the fake Slurm cluster in $dir did not come up (logs in $dir/log)" >&2
    sinfo -N 2>&1 | tail -5 >&2 || true
    exit 1
}

case "$cmd" in
    start) start "$@" ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop DIR [GRES...]" >&2; exit 2 ;;
esac
