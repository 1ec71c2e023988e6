#!/usr/bin/env bash
# Start, stop or query a real SLURM cluster on this machine (munged, MariaDB, slurmdbd, slurmctld,
# slurmd; all state under one directory in /tmp) for the workflow's SLURM integration tests.
# Each node is a pretend GPU node, sized like the machines profiles/slurm asks for (64 CPUs, 256 GB,
# 4 GPUs: booked, not enforced), in two partitions (debug, the default, and gpu), with an accounting
# database and an account `pmlm-test`: `snakemake --profile slurm` runs on it as on a real cluster.
#
# One node (the default): this host, on 127.0.0.1. PMLM_SLURM_NODES=N (N >= 2): N nodes, each a slurmd
# in a network namespace of its own with its own host name (pmlm-n1, pmlm-n2, ...) and address on a
# bridge (10.199.77.11, .12, ...), the controller and slurmdbd on the host's end of the bridge
# (10.199.77.1); /etc/netns/<node>/hosts names every node for the processes inside (tests/slurm/README.md).
#
# Usage: tests/slurm/cluster.sh start|stop|status
#
# Exit status: 0 success (status: cluster up); 1 failure (the reason is printed, with log tails);
# 2 this machine cannot host the cluster (not root, or SLURM missing and no apt-get): callers skip;
# 3 (status only) cluster not running.
#
# Environment (all optional):
#   PMLM_SLURM_DIR              state, configs, logs, pid files    [/tmp/pmlm-slurm]
#   PMLM_SLURM_CTLD_PORT        slurmctld port                     [6817]
#   PMLM_SLURM_SLURMD_PORT      slurmd port                        [6818]
#   PMLM_SLURM_DBD_PORT         slurmdbd port                      [6819]
#   PMLM_SLURM_DB_PORT          MariaDB port (127.0.0.1 only)      [6820]
#   PMLM_SLURM_NODES            compute nodes; 2 or more: one network namespace each     [1]
#   PMLM_SLURM_SUBNET           first three octets of the nodes' /24 (N >= 2)  [10.199.77]
#   PMLM_SLURM_NODE_PREFIX      node (and namespace) names: <prefix>1 ... (N >= 2)        [pmlm-n]
#   PMLM_SLURM_BRIDGE           the bridge joining the namespaces (N >= 2)     [pmlm-br0]
#   PMLM_SLURM_NODE_CPUS        CPUs the node claims (at least this machine's)  [64]
#   PMLM_SLURM_NODE_MEMORY_MB   memory the node claims (at least this machine's) [262144]
#   PMLM_SLURM_NODE_GPUS        fake GPUs                          [4]
#   PMLM_SLURM_MIN_JOB_AGE      seconds a finished job stays visible to squeue [300]
#   PMLM_SLURM_DEF_MEM_PER_CPU  MB given to a job that requests no memory      [1024]
#   PMLM_SLURM_START_TIMEOUT    seconds to wait for the node to become idle    [60]
#   PMLM_SLURM_SYSTEM_CONF      default config path, linked to ours while up [/etc/slurm/slurm.conf]
#   PMLM_SLURM_NO_INSTALL=1     never call apt-get; fail with exit 2 if SLURM is missing
set -euo pipefail
# the daemons live in sbin, which non-login root shells often lack
export PATH=$PATH:/usr/sbin:/sbin

STATE_DIR=${PMLM_SLURM_DIR:-/tmp/pmlm-slurm}
CTLD_PORT=${PMLM_SLURM_CTLD_PORT:-6817}
SLURMD_PORT=${PMLM_SLURM_SLURMD_PORT:-6818}
DBD_PORT=${PMLM_SLURM_DBD_PORT:-6819}
DB_PORT=${PMLM_SLURM_DB_PORT:-6820}
NODE_CPUS=${PMLM_SLURM_NODE_CPUS:-64}
NODE_MEMORY_MB=${PMLM_SLURM_NODE_MEMORY_MB:-262144}
NODE_GPUS=${PMLM_SLURM_NODE_GPUS:-4}
MIN_JOB_AGE=${PMLM_SLURM_MIN_JOB_AGE:-300}
DEF_MEM_PER_CPU=${PMLM_SLURM_DEF_MEM_PER_CPU:-1024}
START_TIMEOUT=${PMLM_SLURM_START_TIMEOUT:-60}
NO_INSTALL=${PMLM_SLURM_NO_INSTALL:-0}
NODES=${PMLM_SLURM_NODES:-1}
SUBNET=${PMLM_SLURM_SUBNET:-10.199.77}
NODE_PREFIX=${PMLM_SLURM_NODE_PREFIX:-pmlm-n}
BRIDGE=${PMLM_SLURM_BRIDGE:-pmlm-br0}

TEMPLATE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/templates
ETC_DIR=$STATE_DIR/etc
RUN_DIR=$STATE_DIR/run
LOG_DIR=$STATE_DIR/log
MUNGE_DIR=$STATE_DIR/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket.2
DB_DIR=$STATE_DIR/mysql
DB_SOCKET=$STATE_DIR/run/mysqld.sock
DEV_DIR=$STATE_DIR/dev
# the account the tests charge jobs to (a real cluster's users get theirs from its admins)
TEST_ACCOUNT=pmlm-test
SLURM_CONF_FILE=$ETC_DIR/slurm.conf
# Commands inside jobs find the cluster through the default config path only: the
# executor's job step strips every SLURM_* variable (SLURM_CONF included) before its srun.
SYSTEM_CONF=${PMLM_SLURM_SYSTEM_CONF:-/etc/slurm/slurm.conf}
# One node: this host, addressed on loopback so that no name resolution is needed. Several nodes: the
# controller on the host's end of the bridge (.1), node i at .(10 + i).
FIRST_NODE_OCTET=11
# what start set up (layout, namespaces, links, hosts files), read back by status and stop
LAYOUT_FILE=$STATE_DIR/layout
NETWORK_FILE=$STATE_DIR/network
# Daemons are stopped with SIGTERM, then SIGKILL after this many seconds in all.
STOP_GRACE_SECONDS=10
# Keep this much of the machine's memory out of RealMemory: slurmd drains a node whose
# configured memory exceeds what it measures.
MEMORY_HEADROOM_PERCENT=5

DEBIAN_PACKAGES=(munge slurm-wlm slurm-client slurmdbd mariadb-server iproute2 util-linux)
REQUIRED_COMMANDS=(munged slurmctld slurmd slurmdbd mariadbd mariadb-install-db mariadb sinfo sbatch squeue scontrol
    srun sacct sacctmgr)
# several nodes: network namespaces, veth pairs and a bridge (iproute2), a host name per node (util-linux)
MULTI_NODE_COMMANDS=(ip nsenter unshare)
# in start order; one slurmd@<node> per node follows (see all_daemons)
HOST_DAEMONS=(munged mariadbd slurmdbd slurmctld)

say() { printf 'pmlm-slurm: %s\n' "$*"; }
fail() { printf 'pmlm-slurm: error: %s\n' "$*" >&2; exit 1; }
unsupported() { printf 'pmlm-slurm: cannot run here: %s\n' "$*" >&2; exit 2; }

pid_file() {
    case $1 in
        munged) echo "$RUN_DIR/munged.pid" ;;
        mariadbd) echo "$RUN_DIR/mariadbd.pid" ;;
        slurmdbd) echo "$RUN_DIR/slurmdbd.pid" ;;
        slurmctld) echo "$RUN_DIR/slurmctld.pid" ;;
        # slurm.conf: SlurmdPidFile=.../slurmd-%n.pid (%n: the node name)
        slurmd@*) echo "$RUN_DIR/slurmd-${1#slurmd@}.pid" ;;
    esac
}

# The daemons of the layout in $LAYOUT_FILE (or of the one about to start), in start order.
all_daemons() {
    local node
    printf '%s\n' "${HOST_DAEMONS[@]}"
    for node in "${NODE_NAMES[@]}"; do
        printf 'slurmd@%s\n' "$node"
    done
}

# Print the pid of a daemon if its pid file names a live process, else nothing.
live_pid() {
    local file pid
    file=$(pid_file "$1")
    [[ -s $file ]] || return 0
    pid=$(tr -dc '0-9' <"$file")
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
        echo "$pid"
    fi
}

missing_commands() {
    local cmd missing=() required=("${REQUIRED_COMMANDS[@]}")
    ((NODES == 1)) || required+=("${MULTI_NODE_COMMANDS[@]}")
    for cmd in "${required[@]}"; do
        command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
    done
    echo "${missing[*]}"
}

ensure_installed() {
    local missing
    missing=$(missing_commands)
    [[ -z $missing ]] && return 0
    if [[ $NO_INSTALL == 1 ]]; then
        unsupported "missing $missing and PMLM_SLURM_NO_INSTALL=1"
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        unsupported "missing $missing and no apt-get to install ${DEBIAN_PACKAGES[*]} (Debian/Ubuntu only)"
    fi
    say "installing ${DEBIAN_PACKAGES[*]} (missing: $missing)"
    # policy-rc.d-less images would start the packaged services; we start our own daemons
    # below, so the packaged ones must not grab the default ports first.
    local policy=/usr/sbin/policy-rc.d created_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 0755 "$policy"
        created_policy=1
    fi
    local rc=0
    {
        apt-get -o DPkg::Lock::Timeout=120 update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 install -y -qq --no-install-recommends \
                "${DEBIAN_PACKAGES[@]}"
    } >"/tmp/pmlm-slurm-apt.log" 2>&1 || rc=$?
    [[ $created_policy == 1 ]] && rm -f "$policy"
    if [[ $rc != 0 ]]; then
        tail -n 20 /tmp/pmlm-slurm-apt.log >&2 || true
        fail "apt-get install ${DEBIAN_PACKAGES[*]} failed (exit $rc); full log: /tmp/pmlm-slurm-apt.log"
    fi
    missing=$(missing_commands)
    [[ -z $missing ]] || fail "still missing after install: $missing"
}

# The node: this host, claiming at least the CPUs and memory of the GPU nodes profiles/slurm sizes its
# jobs for (slurm.conf's SlurmdParameters=config_overrides makes slurmd accept the claim). Jobs book
# these resources; nothing enforces them (no cgroups), so the machine itself may be small.
detect_node() {
    CTLD_HOST=$(hostname -s)
    [[ -n $CTLD_HOST ]] || fail "hostname -s printed nothing; cannot name the controller"
    [[ $NODES =~ ^[1-9][0-9]?$ ]] || fail "PMLM_SLURM_NODES must be a number from 1 to 99, got '$NODES'"
    NODE_NAMES=() NODE_ADDRS=()
    if ((NODES == 1)); then
        CTLD_ADDR=127.0.0.1
        NODE_NAMES=("$CTLD_HOST") NODE_ADDRS=(127.0.0.1)
        NODE_LIST=$CTLD_HOST NODE_ADDR_LIST=127.0.0.1
    else
        [[ $SUBNET =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "PMLM_SLURM_SUBNET must be three octets, e.g. 10.199.77"
        CTLD_ADDR=$SUBNET.1
        local i
        for ((i = 1; i <= NODES; i++)); do
            NODE_NAMES+=("$NODE_PREFIX$i")
            NODE_ADDRS+=("$SUBNET.$((FIRST_NODE_OCTET + i - 1))")
        done
        # SLURM hostlists: pmlm-n[1-3] at 10.199.77.[11-13]
        NODE_LIST="$NODE_PREFIX[1-$NODES]"
        NODE_ADDR_LIST="$SUBNET.[$FIRST_NODE_OCTET-$((FIRST_NODE_OCTET + NODES - 1))]"
    fi
    CPUS=$(nproc)
    ((CPUS >= NODE_CPUS)) || CPUS=$NODE_CPUS
    local mem_kb
    mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
    [[ -n $mem_kb ]] || fail "cannot read MemTotal from /proc/meminfo"
    REAL_MEMORY=$((mem_kb * (100 - MEMORY_HEADROOM_PERCENT) / 100 / 1024))
    ((REAL_MEMORY >= NODE_MEMORY_MB)) || REAL_MEMORY=$NODE_MEMORY_MB
    ((NODE_GPUS >= 1)) || fail "PMLM_SLURM_NODE_GPUS must be at least 1"
}

render() {
    local template=$1 target=$2
    [[ -r $template ]] || fail "template $template not found"
    sed -e "s|@STATE_DIR@|$STATE_DIR|g" \
        -e "s|@CTLD_HOST@|$CTLD_HOST|g" \
        -e "s|@CTLD_ADDR@|$CTLD_ADDR|g" \
        -e "s|@NODE_LIST@|$NODE_LIST|g" \
        -e "s|@NODE_ADDR_LIST@|$NODE_ADDR_LIST|g" \
        -e "s|@CTLD_PORT@|$CTLD_PORT|g" \
        -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" \
        -e "s|@MUNGE_SOCKET@|$MUNGE_SOCKET|g" \
        -e "s|@CPUS@|$CPUS|g" \
        -e "s|@REAL_MEMORY@|$REAL_MEMORY|g" \
        -e "s|@DEF_MEM_PER_CPU@|$DEF_MEM_PER_CPU|g" \
        -e "s|@MIN_JOB_AGE@|$MIN_JOB_AGE|g" \
        -e "s|@DBD_PORT@|$DBD_PORT|g" \
        -e "s|@DB_PORT@|$DB_PORT|g" \
        -e "s|@GPUS@|$NODE_GPUS|g" \
        -e "s|@LAST_GPU@|$((NODE_GPUS - 1))|g" \
        "$template" >"$target.tmp"
    if grep -q '@[A-Z_]*@' "$target.tmp"; then
        fail "unreplaced placeholder in $target: $(grep -o '@[A-Z_]*@' "$target.tmp" | head -n 1)"
    fi
    mv "$target.tmp" "$target"
}

# Refuse to touch a machine that already has its own SLURM configuration.
check_system_conf() {
    if [[ -e $SYSTEM_CONF || -L $SYSTEM_CONF ]] && [[ $(readlink "$SYSTEM_CONF" || true) != "$SLURM_CONF_FILE" ]]; then
        unsupported "$SYSTEM_CONF already exists (a real SLURM setup?); the test cluster links its own config there"
    fi
}

link_system_conf() {
    mkdir -p "$(dirname "$SYSTEM_CONF")"
    ln -sfn "$SLURM_CONF_FILE" "$SYSTEM_CONF"
}

unlink_system_conf() {
    if [[ -L $SYSTEM_CONF && $(readlink "$SYSTEM_CONF") == "$SLURM_CONF_FILE" ]]; then
        rm -f "$SYSTEM_CONF"
    fi
}

log_tails() {
    local f
    for f in "$LOG_DIR"/munged.log "$LOG_DIR"/mariadbd.log "$LOG_DIR"/slurmdbd.log "$LOG_DIR"/slurmctld.log \
        "$LOG_DIR"/slurmd-*.log; do
        [[ -s $f ]] || continue
        printf -- '--- last lines of %s ---\n' "$f" >&2
        tail -n 15 "$f" >&2
    done
}

start_daemon() {
    local name=$1
    shift
    local rc=0
    "$@" >>"$LOG_DIR/$name.stdout" 2>&1 || rc=$?
    if [[ $rc != 0 ]]; then
        log_tails
        cat "$LOG_DIR/$name.stdout" >&2 || true
        fail "$name exited with status $rc at start"
    fi
    # the daemons fork and write their pid file a moment later
    local waited=0
    until [[ -n $(live_pid "$name") ]]; do
        if ((waited >= 100)); then
            log_tails
            fail "$name did not write a live pid to $(pid_file "$name") within 10 s"
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
}

# MariaDB stays in the foreground: run it in a session of its own and wait for its socket. A fresh
# data directory each start (mariadb-install-db, a few seconds); loopback only.
start_database() {
    mariadb-install-db --no-defaults --user=root --datadir="$DB_DIR" --auth-root-authentication-method=normal \
        --skip-test-db >>"$LOG_DIR/mariadbd.stdout" 2>&1 || {
        cat "$LOG_DIR/mariadbd.stdout" >&2
        fail "mariadb-install-db failed"
    }
    setsid mariadbd --no-defaults --user=root --datadir="$DB_DIR" --socket="$DB_SOCKET" --port="$DB_PORT" \
        --bind-address=127.0.0.1 --pid-file="$(pid_file mariadbd)" --log-error="$LOG_DIR/mariadbd.log" \
        --skip-log-bin --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900 </dev/null >>"$LOG_DIR/mariadbd.stdout" 2>&1 &
    local deadline=$((SECONDS + START_TIMEOUT))
    until [[ -S $DB_SOCKET && -n $(live_pid mariadbd) ]] &&
        mariadb --no-defaults -S "$DB_SOCKET" -u root -e 'select 1' >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            log_tails
            fail "MariaDB not answering on $DB_SOCKET after ${START_TIMEOUT}s"
        fi
        sleep 0.2
    done
}

# The cluster and the test account in the accounting database, before slurmctld registers.
wait_for_dbd_and_add_account() {
    local deadline=$((SECONDS + START_TIMEOUT))
    until sacctmgr -n list cluster >/dev/null 2>&1; do
        if ((SECONDS >= deadline)) || [[ -z $(live_pid slurmdbd) ]]; then
            log_tails
            fail "slurmdbd not answering after ${START_TIMEOUT}s"
        fi
        sleep 0.2
    done
    {
        sacctmgr -i add cluster pmlm-local &&
            sacctmgr -i add account "$TEST_ACCOUNT" cluster=pmlm-local description="pmlm tests" organization=pmlm &&
            sacctmgr -i add user root account="$TEST_ACCOUNT" cluster=pmlm-local
    } >>"$LOG_DIR/sacctmgr.stdout" 2>&1 || {
        cat "$LOG_DIR/sacctmgr.stdout" >&2
        fail "sacctmgr could not add the cluster and the account $TEST_ACCOUNT"
    }
}

# Stand-ins for /dev/nvidiaN: character devices like /dev/null (or links to it where mknod is not allowed).
make_gpu_devices() {
    mkdir -p "$DEV_DIR"
    local i
    for ((i = 0; i < NODE_GPUS; i++)); do
        mknod "$DEV_DIR/gpu$i" c 1 3 2>/dev/null || ln -sfn /dev/null "$DEV_DIR/gpu$i"
    done
}

# slurmd registers once at start and retries only after ~10 s, so the controller must be
# answering before slurmd starts.
wait_for_controller() {
    local deadline=$((SECONDS + START_TIMEOUT))
    until SLURM_CONF=$SLURM_CONF_FILE scontrol ping 2>/dev/null | grep -q 'is UP'; do
        if ((SECONDS >= deadline)) || [[ -z $(live_pid slurmctld) ]]; then
            log_tails
            fail "slurmctld not answering after ${START_TIMEOUT}s"
        fi
        sleep 0.2
    done
}

# "<node> <state>" per node, one a line.
node_states() {
    SLURM_CONF=$SLURM_CONF_FILE sinfo -h -N -o '%N %T' 2>/dev/null | sort -u
}

wait_for_idle() {
    local deadline=$((SECONDS + START_TIMEOUT)) states="" node state up name
    while ((SECONDS < deadline)); do
        states=$(node_states || true)
        up=0
        while read -r node state; do
            [[ -n $node ]] || continue
            case $state in
                idle | mixed | allocated) up=$((up + 1)) ;;
                drain* | down* | inval* | fail*)
                    log_tails
                    SLURM_CONF=$SLURM_CONF_FILE scontrol show node "$node" >&2 || true
                    fail "node $node is $state"
                    ;;
            esac
        done <<<"$states"
        ((up == ${#NODE_NAMES[@]})) && return 0
        # slurmd may hold an 'unknown' state until it registers
        while read -r name; do
            if [[ -z $(live_pid "$name") ]]; then
                log_tails
                fail "$name died during start-up"
            fi
        done < <(all_daemons)
        sleep 0.5
    done
    log_tails
    fail "nodes not all idle after ${START_TIMEOUT}s: ${states:-no answer from sinfo}"
}

all_running() {
    local name
    while read -r name; do
        [[ -n $(live_pid "$name") ]] || return 1
    done < <(all_daemons)
    return 0
}

# The node count of the cluster this script last started (from its layout file), or nothing.
running_layout() {
    [[ -r $LAYOUT_FILE ]] && sed -n 's/^nodes=//p' "$LAYOUT_FILE"
    return 0
}

# Cancel leftover jobs (e.g. of an interrupted test) so that no job steps outlive the daemons.
cancel_jobs() {
    [[ -n $(live_pid slurmctld) && -r $SLURM_CONF_FILE ]] || return 0
    export SLURM_CONF=$SLURM_CONF_FILE
    local active=()
    mapfile -t active < <(squeue -h -o %i 2>/dev/null || true)
    ((${#active[@]} > 0)) || return 0
    say "cancelling jobs: ${active[*]}"
    scancel "${active[@]}" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_GRACE_SECONDS))
    while [[ -n $(squeue -h -t RUNNING,COMPLETING -o %i 2>/dev/null || true) ]] && ((SECONDS < deadline)); do
        sleep 0.2
    done
}

# -- several nodes: one network namespace per node on a bridge -----------------------------------------

# Each piece is recorded in $NETWORK_FILE as soon as it exists, so that stop removes exactly what start
# made, even after a start that failed half-way.
record_network() {
    printf '%s %s\n' "$1" "$2" >>"$NETWORK_FILE"
}

# /etc/netns/<node>/hosts: mounted over /etc/hosts for the node's slurmd and so for its job steps (as
# `ip netns exec <node>` does too), so that every node resolves every node name and the controller's name
# to their bridge addresses, as a cluster's DNS would. Each name resolves to the node's own address, never
# to loopback: gloo and NCCL bind to what the host name resolves to.
write_hosts_file() {
    local target=$1 i
    {
        printf '# pmlm test cluster (tests/slurm/cluster.sh); removed by its stop\n'
        printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n'
        printf '%s\t%s\n' "$CTLD_ADDR" "$CTLD_HOST"
        for ((i = 0; i < ${#NODE_NAMES[@]}; i++)); do
            printf '%s\t%s\n' "${NODE_ADDRS[$i]}" "${NODE_NAMES[$i]}"
        done
    } >"$target"
}

setup_network() {
    local i node addr host_end
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        fail "network link $BRIDGE already exists (another test cluster?); stop it or set PMLM_SLURM_BRIDGE"
    fi
    for node in "${NODE_NAMES[@]}"; do
        if ip netns list | grep -qw "^$node"; then
            fail "network namespace $node already exists; remove it (ip netns del $node) or set PMLM_SLURM_NODE_PREFIX"
        fi
    done
    ip link add "$BRIDGE" type bridge
    record_network link "$BRIDGE"
    ip addr add "$CTLD_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for ((i = 0; i < ${#NODE_NAMES[@]}; i++)); do
        node=${NODE_NAMES[$i]} addr=${NODE_ADDRS[$i]} host_end="${NODE_NAMES[$i]}-h"
        ((${#host_end} <= 15)) || fail "link name $host_end is longer than 15 characters; shorten PMLM_SLURM_NODE_PREFIX"
        ip netns add "$node"
        record_network netns "$node"
        # a veth pair: one end on the bridge, the other the node's eth0
        ip link add "$host_end" type veth peer name "$node-c"
        record_network link "$host_end"
        ip link set "$node-c" netns "$node"
        ip -n "$node" link set "$node-c" name eth0
        ip -n "$node" addr add "$addr/24" dev eth0
        ip -n "$node" link set eth0 up
        ip -n "$node" link set lo up
        ip link set "$host_end" master "$BRIDGE" up
        mkdir -p "/etc/netns/$node"
        record_network etc "/etc/netns/$node"
        write_hosts_file "/etc/netns/$node/hosts"
        # the host's DNS server is out of reach from the bridge: lookups of names and addresses not in the hosts
        # file (c10d looks up each peer's address) would wait for its timeout instead of failing at once
        printf '# pmlm test cluster: names come from /etc/hosts\nnameserver 127.0.0.1\n' >"/etc/netns/$node/resolv.conf"
    done
}

# Processes left in a namespace (a job step that outlived its slurmd) go with it.
kill_namespace_processes() {
    local ns=$1 pids=() waited=0
    mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null || true)
    ((${#pids[@]} > 0)) || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    while ((waited < STOP_GRACE_SECONDS * 10)); do
        mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null || true)
        ((${#pids[@]} > 0)) || return 0
        sleep 0.1
        waited=$((waited + 1))
    done
    say "processes in namespace $ns ignored SIGTERM for ${STOP_GRACE_SECONDS}s; sending SIGKILL"
    kill -KILL "${pids[@]}" 2>/dev/null || true
}

teardown_network() {
    [[ -r $NETWORK_FILE ]] || return 0
    local kind name
    # namespaces first (their ends of the veth pairs go with them), then the host's links, then the files
    while read -r kind name; do
        [[ $kind == netns ]] || continue
        kill_namespace_processes "$name"
        ip netns del "$name" 2>/dev/null || true
    done <"$NETWORK_FILE"
    while read -r kind name; do
        [[ $kind == link ]] || continue
        ip link del "$name" 2>/dev/null || true
    done <"$NETWORK_FILE"
    while read -r kind name; do
        [[ $kind == etc && $name == /etc/netns/* ]] || continue
        rm -f "$name/hosts" "$name/resolv.conf"
        rmdir "$name" 2>/dev/null || true
    done <"$NETWORK_FILE"
    rmdir /etc/netns 2>/dev/null || true
    rm -f "$NETWORK_FILE"
}

# slurmd of one node: on this host (one node), or inside the node's network namespace, under its own host
# name and with its hosts and resolv.conf files in place of /etc's (slurmd and everything it starts, job
# steps included, keep all of these). This is what `ip netns exec <node>` does, without its fresh /sys, which would hide the
# host's cgroup mounts that slurmd reads at start.
start_slurmd() {
    local node=$1
    mkdir -p "$STATE_DIR/slurmd/$node"
    if ((NODES == 1)); then
        start_daemon "slurmd@$node" slurmd -f "$SLURM_CONF_FILE" -N "$node"
    else
        start_daemon "slurmd@$node" nsenter --net="/run/netns/$node" \
            unshare --mount --uts --propagation slave -- \
            sh -c 'mount --bind "$3/hosts" /etc/hosts && mount --bind "$3/resolv.conf" /etc/resolv.conf &&
                hostname "$1" && exec slurmd -f "$2" -N "$1"' \
            sh "$node" "$SLURM_CONF_FILE" "/etc/netns/$node"
    fi
}

do_stop() {
    local quiet=${1:-0} name pid pids=() waited=0 file
    cancel_jobs
    # all at once: each daemon takes a second or two to exit, and nothing is left to protect; every pid
    # file counts, whatever layout started them
    for file in "$RUN_DIR"/*.pid; do
        [[ -e $file ]] || continue
        name=$(basename "$file" .pid)
        pid=$(tr -dc '0-9' <"$file")
        [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || continue
        [[ $quiet == 1 ]] || say "stopping $name (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        pids+=("$pid")
    done
    for pid in "${pids[@]}"; do
        while kill -0 "$pid" 2>/dev/null && ((waited < STOP_GRACE_SECONDS * 10)); do
            sleep 0.1
            waited=$((waited + 1))
        done
        if kill -0 "$pid" 2>/dev/null; then
            say "pid $pid ignored SIGTERM for ${STOP_GRACE_SECONDS}s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    teardown_network
    unlink_system_conf
    # refuse to delete anything but our own state directory
    if [[ -d $STATE_DIR && -e $STATE_DIR/.pmlm-slurm ]]; then
        rm -rf "$STATE_DIR"
    fi
}

do_start() {
    [[ $EUID -eq 0 ]] || unsupported "must run as root (it starts munged, MariaDB, slurmdbd, slurmctld and slurmd)"
    ensure_installed
    check_system_conf
    detect_node
    local running
    running=$(running_layout)
    if [[ -n $running ]] && all_running_layout "$running"; then
        if [[ $running != "$NODES" ]]; then
            unsupported "a test cluster of $running node(s) is running; stop it first (tests/slurm/cluster.sh stop)"
        fi
        say "already running ($NODES node(s): $(node_states | tr '\n' ' ')); config: $SLURM_CONF_FILE"
        return 0
    fi
    if [[ -e $STATE_DIR && ! -e $STATE_DIR/.pmlm-slurm ]]; then
        fail "$STATE_DIR exists but was not made by this script; remove it or set PMLM_SLURM_DIR"
    fi
    # a half-started or crashed cluster: clear it and start afresh
    do_stop 1

    mkdir -p "$ETC_DIR" "$RUN_DIR" "$LOG_DIR" "$MUNGE_DIR" "$STATE_DIR/ctld" "$STATE_DIR/slurmd"
    touch "$STATE_DIR/.pmlm-slurm"
    # munged refuses directories that others can write to, and clients must be able to
    # reach its socket; the key itself is readable by root only
    chmod 0755 "$STATE_DIR" "$ETC_DIR" "$RUN_DIR" "$LOG_DIR" "$MUNGE_DIR"
    printf 'nodes=%s\n' "$NODES" >"$LAYOUT_FILE"

    dd if=/dev/urandom of="$MUNGE_DIR/munge.key" bs=1024 count=1 status=none
    chmod 0400 "$MUNGE_DIR/munge.key"

    render "$TEMPLATE_DIR/slurm.conf" "$SLURM_CONF_FILE"
    render "$TEMPLATE_DIR/gres.conf" "$ETC_DIR/gres.conf"
    # slurmdbd reads slurmdbd.conf beside $SLURM_CONF and wants it private to its user
    render "$TEMPLATE_DIR/slurmdbd.conf" "$ETC_DIR/slurmdbd.conf"
    chmod 0600 "$ETC_DIR/slurmdbd.conf"
    make_gpu_devices
    ((NODES == 1)) || setup_network
    link_system_conf
    export SLURM_CONF=$SLURM_CONF_FILE

    say "starting munged, MariaDB, slurmdbd, slurmctld and $NODES slurmd: $NODE_LIST at $NODE_ADDR_LIST" \
        "($CPUS CPUs, ${REAL_MEMORY} MB, $NODE_GPUS fake GPUs each)"
    start_daemon munged munged --force \
        --key-file="$MUNGE_DIR/munge.key" \
        --socket="$MUNGE_SOCKET" \
        --pid-file="$(pid_file munged)" \
        --log-file="$LOG_DIR/munged.log" \
        --seed-file="$MUNGE_DIR/munged.seed"
    start_database
    start_daemon slurmdbd slurmdbd
    wait_for_dbd_and_add_account
    start_daemon slurmctld slurmctld -f "$SLURM_CONF_FILE"
    wait_for_controller
    local node
    for node in "${NODE_NAMES[@]}"; do
        start_slurmd "$node"
    done
    wait_for_idle
    say "up: $(node_states | tr '\n' ' '); partitions debug (default) and gpu, account $TEST_ACCOUNT"
    say "config: $SLURM_CONF_FILE (linked from $SYSTEM_CONF); logs: $LOG_DIR"
}

# Whether every daemon of a cluster of $1 nodes is alive.
all_running_layout() {
    local saved=$NODES
    NODES=$1
    detect_node
    local rc=0
    all_running || rc=1
    NODES=$saved
    detect_node
    return $rc
}

do_status() {
    local name pid up=1 running
    running=$(running_layout)
    if [[ -z $running ]]; then
        say "not running"
        return 3
    fi
    NODES=$running
    detect_node
    while read -r name; do
        pid=$(live_pid "$name")
        if [[ -n $pid ]]; then
            say "$name running (pid $pid)"
        else
            say "$name not running"
            up=0
        fi
    done < <(all_daemons)
    if [[ $up == 1 ]]; then
        SLURM_CONF=$SLURM_CONF_FILE sinfo -N -o '%N %P %T %c %m %G' || up=0
        say "$NODES node(s); config: $SLURM_CONF_FILE (linked from $SYSTEM_CONF); logs: $LOG_DIR"
    fi
    [[ $up == 1 ]] && return 0
    return 3
}

case ${1:-} in
    start) do_start ;;
    stop)
        do_stop 0
        say "stopped"
        ;;
    status) do_status ;;
    *)
        echo "usage: $0 start|stop|status" >&2
        exit 64
        ;;
esac
