#!/usr/bin/env bash
# Single-host Slurm 22.05 cluster for dagster-gpu tests and demos (Debian bookworm, run as root).
#
#   resources/slurm/cluster.sh start     install if missing, start munge, MariaDB, slurmdbd, slurmctld, slurmd;
#                                        wait until the node is idle; create QOS/account (idempotent, fast
#                                        when already running; restarts slurmctld+slurmd if the config changed)
#   resources/slurm/cluster.sh restart   restart slurmctld and slurmd with a freshly rendered config
#                                        (e.g. DAGSTER_GPU_SLURM_MAX_ARRAY_SIZE=101 cluster.sh restart)
#   resources/slurm/cluster.sh stop      stop the daemons this script started (from its pid files only)
#   resources/slurm/cluster.sh restart-slurmctld   stop and start slurmctld alone (same config; its state
#                                        in StateSaveLocation keeps the queue); waits for `scontrol ping`
#   resources/slurm/cluster.sh stop-slurmdbd       stop slurmdbd alone (sacct then fails; slurmctld queues
#                                        accounting records until it is back)
#   resources/slurm/cluster.sh start-slurmdbd      start slurmdbd alone; waits until sacctmgr answers
#   resources/slurm/cluster.sh status    print daemon pids, node state, sinfo; exit 0 only when all run
#   resources/slurm/cluster.sh env       print `export SLURM_CONF=...` (use: eval "$(cluster.sh env)")
#
# Environment:
#   DAGSTER_GPU_SLURM_DIR             state dir (default /tmp/dagster-gpu-slurm)
#   DAGSTER_GPU_SLURM_MAX_ARRAY_SIZE  MaxArraySize (default 1001: highest array index 1000)
#   DAGSTER_GPU_SLURM_START_TIMEOUT   seconds to wait for each daemon (default 60)
#   DAGSTER_GPU_SLURM_CTLD_PORT / _SLURMD_PORT / _DBD_PORT / _DB_PORT   (6817 / 6818 / 6819 / 3307)
#
# The cluster: ClusterName=dagstergpu, slurm partition `gpu` (default), 4 GPUs as GRES on character devices
# (mknod c 195 N) plus 8 `shard` GRES, accounting in slurmdbd (sacct works), QOS `normal` and `high` (high
# preempts normal by requeue), TRESBillingWeights so AllocTRES has `billing=`, account `research` with root.
#
# A failure prints the step that failed and the tail of that daemon's log under $DAGSTER_GPU_SLURM_DIR/log
# (resources/lib/errtrap.sh).
source "$(dirname "${BASH_SOURCE[0]}")/../lib/errtrap.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../lib/slurm_cluster.sh"  # daemons, waits, associations

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
D="${DAGSTER_GPU_SLURM_DIR:-/tmp/dagster-gpu-slurm}"
MAX_ARRAY_SIZE="${DAGSTER_GPU_SLURM_MAX_ARRAY_SIZE:-1001}"
TIMEOUT="${DAGSTER_GPU_SLURM_START_TIMEOUT:-60}"
CTLD_PORT="${DAGSTER_GPU_SLURM_CTLD_PORT:-6817}"
SLURMD_PORT="${DAGSTER_GPU_SLURM_SLURMD_PORT:-6818}"
DBD_PORT="${DAGSTER_GPU_SLURM_DBD_PORT:-6819}"
DB_PORT="${DAGSTER_GPU_SLURM_DB_PORT:-3307}"
CLUSTER=dagstergpu
ACCOUNT=research
HOST="$(hostname -s)"
# render's own sed expressions (resources/lib/slurm_cluster.sh): 22.05's spelling of send_user_signal
# @AUTH_ALT@: no JWT on 22.05 (slurmrestd runs on the 24.11 cluster only, trixie.sh): the line goes
RENDER_SED=(-e "s|@PREEMPT_SEND_USER_SIGNAL@|SlurmctldParameters=preempt_send_user_signal|" -e "/@AUTH_ALT@/d")
RENDER_EXTRA=()  # templates beyond slurm.conf, gres.conf and slurmdbd.conf: none
DAEMON_PLACE=""
export SLURM_CONF="$D/etc/slurm.conf"
# Never let a caller's formats or job context change what our own checks parse.
unset SQUEUE_FORMAT SQUEUE_FORMAT2 SINFO_FORMAT SACCT_FORMAT SLURM_JOB_ID SLURM_ARRAY_JOB_ID || true

log() { printf '[slurm-cluster] %s\n' "$*" >&2; }
# die <message>: stop; the EXIT trap then names the step and prints its log's tail (all of $D/log by default).
die() {
  log "ERROR: $*"
  exit 1
}
dg_step "${1:-} (state in $D)" "$D/log"

# ---------------------------------------------------------------- daemon start (pid files: resources/lib/slurm_cluster.sh)
# launch <name> <cmd...>: start a foreground daemon detached (own session), record its pid.
launch() {
  local name="$1"; shift
  setsid "$@" >>"$D/log/$name.stdout" 2>&1 </dev/null &
  echo $! >"$(pidfile "$name")"
}

# ---------------------------------------------------------------- install + render
install_if_missing() {
  local need=0 b
  for b in slurmctld slurmd slurmdbd sacct munged mariadbd mariadb-install-db; do
    command -v "$b" >/dev/null 2>&1 || need=1
  done
  [ -x /usr/sbin/munged ] || need=1
  if ((need)); then
    dg_step "apt-get install slurm-wlm slurmdbd munge mariadb-server"
    log "installing slurm-wlm slurmdbd munge mariadb-server (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurm-wlm slurmdbd munge mariadb-server >/dev/null
  fi
}

# ---------------------------------------------------------------- daemons
start_munge() {
  alive munged munged && return 0
  dg_step "starting munged" "$D/munge/munged.log"
  chown munge:munge "$D/munge"
  chmod 755 "$D/munge"
  rm -f "$D/munge/munge.socket.2" "$D/munge/munge.socket.2.lock"
  launch munged setpriv --reuid=munge --regid=munge --init-groups \
    /usr/sbin/munged -F --force --socket="$D/munge/munge.socket.2" --pid-file="$D/munge/munged.pid" \
    --log-file="$D/munge/munged.log" --seed-file="$D/munge/munged.seed"
  wait_for "munged socket" "$TIMEOUT" munge -n -S "$D/munge/munge.socket.2"
  log "munged up (pid $(cat "$(pidfile munged)"))"
}

db_client() { mariadb --no-defaults -S "$D/mysqld.sock" -uroot "$@"; }

start_mariadb() {
  alive mariadbd mariadbd && return 0
  dg_step "starting MariaDB (slurmdbd's database)" "$D/log/mariadb.log"
  if [ ! -d "$D/db/mysql" ]; then
    log "initialising MariaDB data dir"
    mariadb-install-db --no-defaults --user=root --datadir="$D/db" >"$D/log/mariadb-install.log" 2>&1 \
      || die "mariadb-install-db failed (see $D/log/mariadb-install.log)"
  fi
  launch mariadbd /usr/sbin/mariadbd --no-defaults --user=root --datadir="$D/db" --socket="$D/mysqld.sock" \
    --pid-file="$D/run/mariadbd.self.pid" --bind-address=127.0.0.1 --port="$DB_PORT" \
    --innodb-buffer-pool-size=64M --log-error="$D/log/mariadb.log" --skip-name-resolve
  wait_for "MariaDB on 127.0.0.1:$DB_PORT" "$TIMEOUT" mariadb-admin --no-defaults -S "$D/mysqld.sock" -uroot ping
  db_client -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
    ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS'; ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
    CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" \
    || die "cannot create the slurm database user"
  log "MariaDB up (pid $(cat "$(pidfile mariadbd)"))"
}

start_slurmdbd() {
  alive slurmdbd slurmdbd && return 0
  dg_step "starting slurmdbd" "$D/log/slurmdbd.log"
  launch slurmdbd /usr/sbin/slurmdbd -D
  wait_for "slurmdbd on 127.0.0.1:$DBD_PORT" "$TIMEOUT" sacctmgr -n -P show cluster format=cluster
  log "slurmdbd up (pid $(cat "$(pidfile slurmdbd)"))"
}

cmd_start() {
  install_if_missing
  render_all
  start_munge
  start_mariadb
  start_slurmdbd
  if ((CONF_CHANGED)) && { alive slurmctld slurmctld || alive slurmd slurmd; }; then
    log "slurm.conf changed (MaxArraySize=$MAX_ARRAY_SIZE): restarting slurmctld and slurmd"
    restart_ctld_and_slurmd
  else
    start_slurmctld
    start_slurmd
  fi
  wait_node
  ensure_associations
  log "cluster ready: SLURM_CONF=$SLURM_CONF MaxArraySize=$(scontrol show config | awk '/^MaxArraySize/ {print $3}')"
}

cmd_restart() {
  install_if_missing
  render_all
  start_munge
  start_mariadb
  start_slurmdbd
  restart_ctld_and_slurmd
  wait_node
  ensure_associations
  log "cluster restarted: MaxArraySize=$(scontrol show config | awk '/^MaxArraySize/ {print $3}')"
}

# Fault injection (bench/faults.py): one daemon at a time, the others untouched. They act only on a
# cluster that `start` brought up (its pid files and rendered config).
need_started() {
  [ -s "$SLURM_CONF" ] || die "no cluster under $D (run: $0 start)"
}

cmd_restart_slurmctld() {
  need_started
  stop_one slurmctld slurmctld
  start_slurmctld
}

cmd_stop_slurmdbd() {
  need_started
  stop_one slurmdbd slurmdbd
}

cmd_start_slurmdbd() {
  need_started
  alive munged munged && alive mariadbd mariadbd || die "munged or MariaDB is not running (run: $0 start)"
  start_slurmdbd
}

cmd_stop() {
  [ -d "$D/run" ] || { log "nothing to stop under $D"; return 0; }
  stop_one slurmd slurmd
  stop_one slurmctld slurmctld
  stop_one slurmdbd slurmdbd
  stop_one mariadbd mariadbd
  stop_one munged munged
}

case "${1:-}" in
  start) cmd_start ;;
  restart) cmd_restart ;;
  stop) cmd_stop ;;
  restart-slurmctld) cmd_restart_slurmctld ;;
  stop-slurmdbd) cmd_stop_slurmdbd ;;
  start-slurmdbd) cmd_start_slurmdbd ;;
  status) cmd_status ;;
  env) echo "export SLURM_CONF=$(printf '%q' "$SLURM_CONF")" ;;
  *) echo "usage: $0 start|restart|stop|status|env|restart-slurmctld|stop-slurmdbd|start-slurmdbd" >&2; exit 2 ;;
esac
