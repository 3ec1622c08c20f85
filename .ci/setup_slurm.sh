#!/usr/bin/env bash
# A single-machine Slurm cluster for the tests: slurmctld plus one slurmd per fake node, all on
# this host (Debian 12: Slurm 22.05, munge; no slurmdbd, no systemd), proctrack/cgroup.
#
# Usage (as root):  bash .ci/setup_slurm.sh [NODES] [GPUS]   up (default 4 nodes x 8 fake GPUs)
#                   bash .ci/setup_slurm.sh --down           stop the daemons it started (by pid)
# Nodes node1..nodeN are all this machine (NodeAddr 127.0.0.1, slurmd ports 17001..); partition
# `debug`. Fake GPUs are character devices 1,3 (the null device) under /run/slurm/fakegpu/<node>:
# `--gres=gpu:K` allocates them and sets CUDA_VISIBLE_DEVICES; nothing is a real GPU.
# proctrack/cgroup (cgroup v1 freezer) makes a step's processes die with the step, as on real
# sites (proctrack/linuxproc lets a setsid'd process escape, so a wrong design would pass); the
# tests assert it. Idempotent: packages and the munge key once; a daemon starts only when its
# pid file names no live process of its name. Kills only the pids in its own pid files.
# sacct has no data (no slurmdbd): job and step state come from squeue/scontrol.
set -euo pipefail

say() { echo "setup_slurm: $*" >&2; }
alive() { [ -s "$1" ] && [ -d "/proc/$(cat "$1")" ] && grep -q "$2" "/proc/$(cat "$1")/comm"; }
halt() { # halt PIDFILE NAME: TERM the pid in PIDFILE if it is a live NAME, wait up to 10 s
    if alive "$1" "$2"; then
        local pid
        pid="$(cat "$1")"
        kill -TERM "$pid"
        for _ in $(seq 100); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
        say "$2 stopped (pid $pid)"
    fi
    rm -f "$1"
}
[ "$(id -u)" -eq 0 ] || { say "must run as root"; exit 1; }

if [ "${1:-}" = "--down" ]; then
    for f in /run/slurm/slurmd-node*.pid; do [ -e "$f" ] && halt "$f" slurmd; done
    halt /run/slurm/slurmctld.pid slurmctld
    halt /run/munge/munged.pid munged
    exit 0
fi

NODES="${1:-4}"
GPUS="${2:-8}"
[[ "$NODES" =~ ^[1-9][0-9]?$ && "$GPUS" =~ ^[1-9][0-9]?$ ]] || { say "bad NODES/GPUS: $*"; exit 1; }
HOST="$(hostname -s)"
[ -d /sys/fs/cgroup/freezer ] || { say "no cgroup v1 freezer at /sys/fs/cgroup/freezer: proctrack/cgroup cannot run"; exit 1; }

# 1. packages (no recommends)
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
    || ! command -v munged >/dev/null || ! command -v srun >/dev/null; then
    say "installing slurmctld slurmd slurm-client munge"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurmctld slurmd slurm-client munge >/dev/null
fi

# 2. configuration: rewritten every time (cheap; a daemon already up keeps what it read)
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/slurm
cat > /etc/slurm/slurm.conf <<EOF
ClusterName=servesweep
SlurmctldHost=${HOST}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=120
ReturnToService=2
SchedulerType=sched/backfill
MpiDefault=none
CommunicationParameters=NoInAddrAny
SlurmctldTimeout=30
SlurmdTimeout=30
KillWait=5
GresTypes=gpu
# 16 CPUs per node whatever this machine has (config_overrides): every allocation and step takes
# one, so several tests' allocations fit on one node side by side (pytest-xdist)
SlurmdParameters=config_overrides
NodeName=node[1-${NODES}] NodeHostname=${HOST} NodeAddr=127.0.0.1 Port=[17001-$((17000 + NODES))] CPUs=16 RealMemory=4000 Gres=gpu:${GPUS} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
{
    echo "AutoDetect=off"
    for n in $(seq "$NODES"); do
        mkdir -p "/run/slurm/fakegpu/node$n"
        for i in $(seq 0 $((GPUS - 1))); do
            f="/run/slurm/fakegpu/node$n/nvidia$i"
            [ -c "$f" ] || mknod -m 666 "$f" c 1 3
        done
        echo "NodeName=node$n Name=gpu File=/run/slurm/fakegpu/node$n/nvidia[0-$((GPUS - 1))]"
    done
} > /etc/slurm/gres.conf
cat > /etc/slurm/cgroup.conf <<'EOF'
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
EOF

# 3. munge (the package made the key; munged refuses to run as root)
mkdir -p /run/munge && chown munge:munge /run/munge
alive /run/munge/munged.pid munged || runuser -u munge -- /usr/sbin/munged
# 4. daemons
alive /run/slurm/slurmctld.pid slurmctld || /usr/sbin/slurmctld
for n in $(seq "$NODES"); do
    alive "/run/slurm/slurmd-node$n.pid" slurmd || /usr/sbin/slurmd -N "node$n"
done
# 5. every node idle (a node an earlier run left down or drained is resumed)
for _ in $(seq 150); do
    states="$(sinfo -h -N -o '%N %T' 2>/dev/null || true)"
    if [ -n "$states" ] && ! grep -qvE ' (idle|mixed|allocated)$' <<<"$states"; then break; fi
    for node in $(grep -E ' (down|drained|draining)' <<<"$states" | awk '{print $1}' || true); do
        scontrol update nodename="$node" state=resume 2>/dev/null || true
    done
    sleep 0.2
done
sinfo -N -o '%N %T %G' >&2
if grep -qvE ' (idle|mixed|allocated)$' <<<"$(sinfo -h -N -o '%N %T')"; then
    say "nodes not up (see /var/log/slurm/)"
    exit 1
fi
say "up: $NODES nodes x $GPUS fake GPUs, proctrack/cgroup"
