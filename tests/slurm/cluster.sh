#!/usr/bin/env bash
# A SLURM on localhost for the workflow's SLURM tests (and for trying the SLURM profile by
# hand): one node or several, in one partition or several. Needs root and Debian's
# slurm-wlm + munge; no systemd, no accounting.
#
#   tests/slurm/cluster.sh up [NGPUS] [--nodes N]   N nodes (default 1) with NGPUS fake GPUs each
#                                                   (default 8), in one partition, debug (idempotent)
#   tests/slurm/cluster.sh up --partition NAME:N:G ...   a partition of N nodes with G fake GPUs
#                                                   each per --partition; the first is the default
#   tests/slurm/cluster.sh down         cancel our jobs, stop what `up` started (idempotent)
#   tests/slurm/cluster.sh status       exit 0 if the cluster answers and every node is usable
#   tests/slurm/cluster.sh env          print `export SLURM_CONF=...` for the client commands
#   tests/slurm/cluster.sh nodes NAME   print partition NAME's nodes, one a line
#
# Every node is one slurmd on this machine (`slurmd -N <name>`, each with its own port, spool
# directory, pid and log file: %n in slurm.conf), named wattflex-node0, wattflex-node1, ...
# through the partitions in order. A job on two of them is a real two-node allocation (a
# slurmstepd and SLURMD_NODENAME / SLURM_NODEID per node, srun steps across both) whose
# processes share this machine's CPUs, loopback and filesystem. Partitions give tests that
# run at the same time nodes of their own on one cluster (tests/slurm_cluster.py).
# Everything lives in $WATTFLEX_SLURM_DIR (default /run/slurm): slurm.conf, gres.conf, state,
# spool, logs and pid files. /etc/slurm/slurm.conf becomes a link to our slurm.conf while the
# cluster is up, because the executor's job step strips SLURM_CONF before calling srun (so
# one such cluster per machine); an existing slurm.conf there (a real cluster) is never
# touched: `up` refuses. GPUs are fake: character devices /dev/fakegpuN (NVIDIA's major
# 195 and minor N, which no test opens) listed in gres.conf with type "h200", which is all slurmd needs to schedule them
# (file-less GPUs are dropped); the nodes also have the feature "h200", so both ways of
# asking for a GPU model can be tried.
# WATTFLEX_SLURM_EPILOG=PATH installs PATH as the nodes' Epilog.
# Without accounting the Snakemake executor must poll with squeue, which only sees jobs
# that ended within MinJobAge: keep it far above 3x the first status-check delay.
set -euo pipefail

DIR=${WATTFLEX_SLURM_DIR:-/run/slurm}
PORT=${WATTFLEX_SLURM_PORT:-6817}          # slurmctld; slurmd uses PORT+1
NODE_BASE=wattflex-node                        # nodes wattflex-node0, wattflex-node1, ...
GPU_TYPE=h200
CONF=$DIR/slurm.conf
ETC_CONF=/etc/slurm/slurm.conf

die() { echo "cluster.sh: $*" >&2; exit 1; }
export SLURM_CONF=$CONF

need_tools() {
  [ "$(id -u)" = 0 ] || die "must run as root (starts daemons, creates /dev/fakegpuN)"
  for t in munged slurmctld slurmd scontrol sinfo; do
    command -v "$t" >/dev/null || die "$t not found: apt-get install slurm-wlm munge"
  done
}

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# The nodes of the running (or last) cluster, from its slurm.conf.
nodes() { [ -f "$CONF" ] && sed -n 's/^NodeName=\([^ ]*\) .*/\1/p' "$CONF"; }

node_state() { sinfo -h -n "$1" -o %T 2>/dev/null | head -n1; }

node_ok() {
  alive "$DIR/slurmd.$1.pid" \
    && case "$(node_state "$1")" in idle* | mixed* | allocated* | completing*) true ;; *) false ;; esac
}

cluster_ok() {
  [ -f "$CONF" ] && alive "$DIR/slurmctld.pid" && scontrol ping 2>/dev/null | grep -q UP || return 1
  local n
  for n in $(nodes); do node_ok "$n" || return 1; done
}

start_munge() {
  # Reuse a working munged (e.g. the system's); otherwise start one as the munge user.
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  chmod 0755 /run/munge
  [ -s /etc/munge/munge.key ] || { mungekey --create --keyfile=/etc/munge/munge.key; chown munge:munge /etc/munge/munge.key; }
  runuser -u munge -- munged --force
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || die "munged did not start (see /var/log/munge/munged.log)"
  cp /run/munge/munged.pid "$DIR/munged.pid"   # ours: `down` stops it
}

# slurm.conf and gres.conf for the partitions NAME:N:G given, nodes numbered through them.
write_conf() {
  local geometry part pname n g i k=0 maxg=0 members default=YES
  # Node geometry as slurmd itself reports it (CPUs, sockets, cores, memory).
  geometry=$(slurmd -C | head -n1 | sed -e 's/^NodeName=[^ ]* //' -e 's/ UpTime=.*//')
  for part in "$@"; do g=${part##*:}; [ "$g" -gt "$maxg" ] && maxg=$g; done
  for i in $(seq 0 $((maxg - 1))); do
    # NVIDIA's character major (195, 0xc3) and minor i, as /dev/nvidia<i>: the sudo wrapper
    # follows SLURM's GPU to its device file's minor (slurm/wattflex-setcap)
    if [ "$(stat -c %t:%T "/dev/fakegpu$i" 2>/dev/null)" != "$(printf 'c3:%x' "$i")" ]; then
      rm -f "/dev/fakegpu$i" && mknod -m 0600 "/dev/fakegpu$i" c 195 "$i"
    fi
  done
  cat >"$CONF" <<EOF
# Written by tests/slurm/cluster.sh: a test cluster on one machine, fake GPUs, no accounting.
# Partitions: $*
ClusterName=wattflex-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/d/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# squeue must still list finished jobs when the executor polls (>= 3x its first delay).
MinJobAge=600
KillWait=5
InactiveLimit=0
MessageTimeout=10
${WATTFLEX_SLURM_EPILOG:+Epilog=$WATTFLEX_SLURM_EPILOG}
GresTypes=gpu
EOF
  : >"$DIR/gres.conf"
  for part in "$@"; do
    IFS=: read -r pname n g <<<"$part"
    members=""
    for _ in $(seq "$n"); do
      name=$NODE_BASE$k
      echo "NodeName=$name NodeAddr=127.0.0.1 NodeHostname=$name Port=$((PORT + 1 + k)) $geometry Gres=gpu:$GPU_TYPE:$g Feature=$GPU_TYPE State=UNKNOWN" >>"$CONF"
      echo "NodeName=$name Name=gpu Type=$GPU_TYPE File=/dev/fakegpu[0-$((g - 1))]" >>"$DIR/gres.conf"
      mkdir -p "$DIR/d/$name"
      members=${members:+$members,}$name
      k=$((k + 1))
    done
    echo "PartitionName=$pname Nodes=$members Default=$default MaxTime=INFINITE State=UP" >>"$CONF.partitions"
    default=NO
  done
  cat "$CONF.partitions" >>"$CONF" && rm -f "$CONF.partitions"
}

up() {
  local ngpus=8 nnodes=1 n part parts=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --nodes) nnodes=${2:-}; shift $(($# > 1 ? 2 : 1)) ;;
      --nodes=*) nnodes=${1#--nodes=}; shift ;;
      --partition) parts+=("${2:-}"); shift $(($# > 1 ? 2 : 1)) ;;
      --partition=*) parts+=("${1#--partition=}"); shift ;;
      *) ngpus=$1; shift ;;
    esac
  done
  [[ $ngpus =~ ^[1-9][0-9]*$ && $nnodes =~ ^[1-9][0-9]*$ ]] \
    || die "up: NGPUS and --nodes take positive integers (got NGPUS=$ngpus, --nodes=$nnodes)"
  [ ${#parts[@]} -gt 0 ] || parts=("debug:$nnodes:$ngpus")
  for part in "${parts[@]}"; do
    [[ $part =~ ^[A-Za-z][A-Za-z0-9_]*:[1-9][0-9]*:[1-9][0-9]*$ ]] \
      || die "up: --partition takes NAME:NODES:GPUS, e.g. debug:2:1 (got '$part')"
  done
  need_tools
  if cluster_ok && [ "$(sed -n 's/^# Partitions: //p' "$CONF")" = "${parts[*]}" ]; then
    echo "cluster.sh: already up ($CONF)"; return
  fi
  down_daemons
  mkdir -p "$DIR/ctld" "$DIR/d"
  start_munge
  write_conf "${parts[@]}"
  if [ -e "$ETC_CONF" ] || [ -L "$ETC_CONF" ]; then
    [ "$(readlink "$ETC_CONF")" = "$CONF" ] || die "$ETC_CONF exists and is not ours; not starting a test cluster here"
  else
    mkdir -p /etc/slurm && ln -s "$CONF" "$ETC_CONF"
  fi
  slurmctld -c -f "$CONF"     # -c: fresh state, no jobs from an earlier test run
  for n in $(nodes); do slurmd -f "$CONF" -N "$n"; done
  for _ in $(seq 100); do cluster_ok && break; sleep 0.1; done
  if ! cluster_ok; then
    # A node that registered as down (e.g. after an unclean stop) only needs a resume.
    for n in $(nodes); do scontrol update NodeName="$n" State=RESUME 2>/dev/null || true; done
    for _ in $(seq 50); do cluster_ok && break; sleep 0.2; done
  fi
  cluster_ok || { tail -n 20 "$DIR"/slurmctld.log "$DIR"/slurmd.*.log >&2 || true; die "cluster did not come up"; }
  echo "cluster.sh: up: partitions ${parts[*]} (NAME:NODES:GPUS per node), nodes $(nodes | paste -sd,), $(sinfo -h -o %c -n "${NODE_BASE}0") CPUs each; export SLURM_CONF=$CONF"
}

stop_pid() {  # stop the daemon whose pid file is $1, if it is still running
  alive "$1" || { rm -f "$1"; return 0; }
  local pid; pid=$(cat "$1")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$1"
}

down_daemons() {
  local pid
  for pid in "$DIR"/slurmd.*.pid "$DIR/slurmd.pid"; do
    if [ -e "$pid" ]; then stop_pid "$pid"; fi
  done
  stop_pid "$DIR/slurmctld.pid"
}

down() {
  [ -d "$DIR" ] || { echo "cluster.sh: nothing to stop"; return; }
  if alive "$DIR/slurmctld.pid"; then
    scancel --cluster=wattflex-test --full --signal=KILL --user="$(id -un)" 2>/dev/null || scancel --user="$(id -un)" 2>/dev/null || true
  fi
  down_daemons
  stop_pid "$DIR/munged.pid"
  [ "$(readlink "$ETC_CONF" 2>/dev/null)" = "$CONF" ] && rm -f "$ETC_CONF"
  rm -f /dev/fakegpu[0-9]* 2>/dev/null || true
  echo "cluster.sh: down"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  status) cluster_ok ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  nodes) [ -n "${2:-}" ] || die "nodes: name a partition"
         sed -n "s/^PartitionName=$2 Nodes=\([^ ]*\) .*/\1/p" "$CONF" | tr , '\n' ;;
  *) echo "usage: $0 up [NGPUS] [--nodes N] | up --partition NAME:NODES:GPUS ... | down | status | env | nodes NAME" >&2
     exit 2 ;;
esac
