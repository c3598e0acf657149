#!/usr/bin/env bash
# A one-host Slurm for the tests that run msf through srun and sbatch (tests/integration/test_slurm_real.py).
#
#   bash scripts/slurm_local.sh start    # install slurm-wlm and munge if missing, start munged, slurmctld, slurmd
#   bash scripts/slurm_local.sh stop     # cancel its jobs, stop the daemons, remove what start created
#   bash scripts/slurm_local.sh status   # exit 0 when the controller answers and the node is up
#
# Everything lives in one folder it owns, MSF_SLURM_DIR (default /tmp/msf-slurm): slurm.conf, a munge key and
# socket of its own, the daemons' state, spool, pid files and logs. The clients (sinfo, srun, sbatch, scontrol)
# find the configuration through /etc/slurm/slurm.conf, which start links to MSF_SLURM_DIR/slurm.conf when no
# slurm.conf is there (and stop removes the link); where one is there already, it is left alone and start
# prints the SLURM_CONF to export. Both commands are idempotent: start on a running Slurm checks it and
# returns, stop on a stopped one does nothing. Needs root (apt-get, daemons running as root) and no cgroups:
# processes are tracked with proctrack/linuxproc and tasks are not bound (task/none).
#
# Two nodes, both this host: NodeName=$(hostname -s) and NodeName=localhost, each with a slurmd of its own (slurmd
# -N NAME, own port, spool and pid file). A heterogeneous job (#SBATCH hetjob) needs the second: on a one-node
# Slurm it stays pending (Resources) for ever, because the backfill scheduler, the only one that starts
# heterogeneous jobs, reserves the node it plans for one component as a whole, and every other component then finds
# no node to start at the same time (slurm-wlm 22.05.8; OverSubscribe=YES and --oversubscribe change nothing).
# Both names resolve to this host, so a script that connects to a component's node by name
# (scontrol show hostnames) works here as on a cluster.
set -euo pipefail

DIR=${MSF_SLURM_DIR:-/tmp/msf-slurm}
CONF=$DIR/slurm.conf
OWNED=$DIR/.msf-slurm-local  # marks the folder as this script's, so stop never removes a folder it did not make
ETC_CONF=/etc/slurm/slurm.conf
CTLD_PORT=${MSF_SLURM_CTLD_PORT:-6817}
SLURMD_PORT=${MSF_SLURM_SLURMD_PORT:-6818}
WAIT_S=${MSF_SLURM_WAIT_S:-60}
HOST=$(hostname -s)
NODES=("$HOST" localhost)
SLURMD_PORTS=("$SLURMD_PORT" $((SLURMD_PORT + 2))) # not + 1: 6819 is slurmdbd's port

say() { echo "slurm_local: $*"; }
die() {
	echo "slurm_local: error: $*" >&2
	exit 1
}

# The pid in FILE when that process is alive and runs COMM (a stale pid file, or a pid reused by another
# program, gives nothing).
live_pid() {
	local file=$1 comm=$2 pid
	[[ -f $file ]] || return 1
	pid=$(tr -dc 0-9 <"$file")
	[[ -n $pid && -r /proc/$pid/comm ]] || return 1
	[[ $(cat "/proc/$pid/comm") == "$comm"* ]] || return 1
	echo "$pid"
}

# the state of NODE (default: this host's node)
node_state() { SLURM_CONF=$CONF timeout 10 sinfo -h -n "${1:-$HOST}" -o %T 2>/dev/null | head -n1; }

install() {
	if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sinfo >/dev/null &&
		command -v munged >/dev/null && command -v mungekey >/dev/null; then
		return
	fi
	[[ $(id -u) == 0 ]] || die "slurm-wlm and munge are not installed, and installing them needs root"
	say "installing slurm-wlm and munge (apt-get)"
	export DEBIAN_FRONTEND=noninteractive
	timeout 600 apt-get update -qq >/dev/null || die "apt-get update failed (or took over 10 minutes)"
	timeout 900 apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null ||
		die "apt-get install slurm-wlm munge failed"
}

write_conf() {
	local cpus
	cpus=$(nproc)
	cat >"$CONF" <<EOF
# Written by scripts/slurm_local.sh for msf's tests: one host, no accounting, no cgroups.
ClusterName=msflocal
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
MailProg=/bin/true
InactiveLimit=0
# SIGTERM, then SIGKILL after KillWait seconds (Slurm's default), as on a cluster
KillWait=30
NodeName=${NODES[0]} NodeHostname=$HOST NodeAddr=127.0.0.1 Port=${SLURMD_PORTS[0]} CPUs=$cpus State=UNKNOWN
NodeName=${NODES[1]} NodeHostname=$HOST NodeAddr=127.0.0.1 Port=${SLURMD_PORTS[1]} CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=${NODES[0]},${NODES[1]} Default=YES MaxTime=INFINITE State=UP
EOF
}

start_munged() {
	if live_pid "$DIR/munge/munged.pid" munged >/dev/null; then
		return
	fi
	mkdir -p "$DIR/munge"
	chmod 0755 "$DIR/munge" # the socket in it must be reachable by every user; the key is 0600
	[[ -f $DIR/munge/munge.key ]] || mungekey --create --keyfile="$DIR/munge/munge.key" ||
		die "mungekey could not create $DIR/munge/munge.key"
	chmod 0600 "$DIR/munge/munge.key"
	munged --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
		--pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" \
		--seed-file="$DIR/munge/munged.seed" ||
		die "munged did not start; see $DIR/log/munged.log"
}

start_slurmctld() {
	if live_pid "$DIR/slurmctld.pid" slurmctld >/dev/null; then
		return
	fi
	slurmctld -f "$CONF" || die "slurmctld did not start; see $DIR/log/slurmctld.log"
}

start_slurmd() {
	local node=$1
	if live_pid "$DIR/slurmd.$node.pid" slurmd >/dev/null; then
		return
	fi
	mkdir -p "$DIR/spool/$node"
	slurmd -f "$CONF" -N "$node" || die "slurmd -N $node did not start; see $DIR/log/slurmd.$node.log"
}

link_conf() {
	if [[ -L $ETC_CONF && $(readlink "$ETC_CONF") == "$CONF" ]]; then
		return
	fi
	if [[ -e $ETC_CONF || -L $ETC_CONF ]]; then
		say "$ETC_CONF exists and is not this script's: left alone; export SLURM_CONF=$CONF to use this Slurm"
		return
	fi
	mkdir -p "$(dirname "$ETC_CONF")"
	ln -s "$CONF" "$ETC_CONF"
	touch "$DIR/.linked-etc-conf"
}

wait_idle() {
	local node=$1 deadline state=""
	deadline=$((SECONDS + WAIT_S))
	while ((SECONDS < deadline)); do
		state=$(node_state "$node" || true)
		case $state in
		idle* | mixed* | allocated*) return 0 ;;
		down* | drain*) SLURM_CONF=$CONF scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true ;;
		esac
		sleep 1
	done
	die "node $node is not idle after ${WAIT_S}s (sinfo says '${state:-no answer}'); see $DIR/log/"
}

start() {
	install
	[[ $HOST != localhost ]] || die "this host is named localhost: its two Slurm nodes need another name for the first"
	if [[ -e $DIR && ! -f $OWNED ]]; then
		die "$DIR exists and is not this script's folder; set MSF_SLURM_DIR to another path"
	fi
	mkdir -p "$DIR/log" "$DIR/state" "$DIR/spool"
	touch "$OWNED"
	[[ -f $CONF ]] || write_conf
	start_munged
	start_slurmctld
	start_slurmd "${NODES[0]}"
	start_slurmd "${NODES[1]}"
	link_conf
	wait_idle "${NODES[0]}"
	wait_idle "${NODES[1]}"
	say "running: $(SLURM_CONF=$CONF sinfo --version), nodes ${NODES[0]} $(node_state) and ${NODES[1]}" \
		"$(node_state "${NODES[1]}") (both this host), state in $DIR"
	say "SLURM_CONF=$CONF"
}

stop_pid() {
	local file=$1 comm=$2 pid i
	pid=$(live_pid "$file" "$comm") || return 0
	kill -TERM "$pid" 2>/dev/null || return 0
	for ((i = 0; i < 100; i++)); do
		[[ -d /proc/$pid ]] || return 0
		sleep 0.1
	done
	say "$comm (pid $pid) did not stop on SIGTERM within 10 s: SIGKILL"
	kill -KILL "$pid" 2>/dev/null || true
}

stop() {
	if [[ ! -f $OWNED ]]; then
		say "not running (no $DIR)"
		return
	fi
	# jobs first, so that slurmd ends their steps before it stops
	if live_pid "$DIR/slurmctld.pid" slurmctld >/dev/null; then
		SLURM_CONF=$CONF timeout 10 scancel --full --quiet --partition=debug 2>/dev/null || true
		local deadline=$((SECONDS + 40))
		while ((SECONDS < deadline)) && [[ -n $(SLURM_CONF=$CONF timeout 10 squeue -h -o %i 2>/dev/null) ]]; do
			sleep 1
		done
	fi
	stop_pid "$DIR/slurmd.${NODES[0]}.pid" slurmd
	stop_pid "$DIR/slurmd.${NODES[1]}.pid" slurmd
	stop_pid "$DIR/slurmctld.pid" slurmctld
	stop_pid "$DIR/munge/munged.pid" munged
	if [[ -f $DIR/.linked-etc-conf && -L $ETC_CONF && $(readlink "$ETC_CONF") == "$CONF" ]]; then
		rm -f "$ETC_CONF"
	fi
	rm -rf "$DIR"
	say "stopped; removed $DIR"
}

status() {
	local state
	state=$(node_state || true)
	[[ -n $state ]] || {
		say "not answering"
		return 1
	}
	say "node $HOST $state"
}

case ${1:-} in
start) start ;;
stop) stop ;;
status) status ;;
*)
	echo "usage: $0 start|stop|status" >&2
	exit 2
	;;
esac
