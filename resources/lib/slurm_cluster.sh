# shellcheck shell=bash
# The Slurm daemons' lifecycle shared by the two test clusters (resources/slurm/cluster.sh: 22.05 on the host;
# resources/slurm/trixie.sh: 24.11 in a Debian trixie root), sourced after errtrap.sh:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/../lib/slurm_cluster.sh"
#
# The configuration rendered from the templates (render, render_all), pid files (only what the script
# started), waits, slurmctld and slurmd start, the node's readiness, the accounting associations (cluster, QOS
# high/normal with preemption by requeue, account, user root).
# The sourcing script provides: `log`, `die`, `launch <name> <cmd...>` (start a foreground daemon detached and
# write its pid file), the variables D, HERE (the templates' folder), HOST, TIMEOUT, CLUSTER, ACCOUNT,
# SLURM_CONF, MAX_ARRAY_SIZE, CTLD_PORT, SLURMD_PORT, DBD_PORT, DB_PORT, the arrays RENDER_SED and RENDER_EXTRA
# (see render and render_all), DAEMON_PLACE (a suffix for step names, e.g. " (in the root)"), and the
# commands scontrol, sinfo and sacctmgr (functions where they run elsewhere). Early readers (`| grep -q`,
# `| head`) would fail a pipeline with SIGPIPE under pipefail: every check reads the command's whole output
# first.

# ---------------------------------------------------------------- configuration
# render <template> <dest> <mode>: the template with its @NAME@ placeholders filled (and the sourcing script's
# own sed expressions RENDER_SED, an array) written to dest atomically; returns 1 when dest is unchanged.
render() {
  local tmp
  tmp="$(mktemp "$D/etc/.render.XXXXXX")"
  sed -e "s|@D@|$D|g" -e "s|@HOST@|$HOST|g" -e "s|@CLUSTER@|$CLUSTER|g" \
      -e "s|@CPUS@|$CPUS|g" -e "s|@MEM_MB@|$MEM_MB|g" -e "s|@OVERSUBSCRIBE@|$OVERSUBSCRIBE|g" \
      -e "s|@MAX_ARRAY_SIZE@|$MAX_ARRAY_SIZE|g" -e "s|@CTLD_PORT@|$CTLD_PORT|g" \
      -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" -e "s|@DBD_PORT@|$DBD_PORT|g" -e "s|@DB_PORT@|$DB_PORT|g" \
      -e "s|@DB_PASS@|$DB_PASS|g" "${RENDER_SED[@]}" "$1" >"$tmp"
  chmod "$3" "$tmp"
  if [ -f "$2" ] && cmp -s "$tmp" "$2"; then
    rm -f "$tmp"
    return 1  # unchanged
  fi
  mv -f "$tmp" "$2"
  return 0
}

# render_all: the state dirs, the fake GPU device nodes and the configuration in $D/etc from $HERE's templates
# (slurm.conf, gres.conf, slurmdbd.conf, and each <template> <dest> pair of RENDER_EXTRA); sets CONF_CHANGED=1
# when a file slurmctld/slurmd read at start changed, DBD_CONF_CHANGED=1 when slurmdbd.conf did.
render_all() {
  dg_step "rendering the Slurm configuration into $D/etc" "$D/log"
  [[ "$MAX_ARRAY_SIZE" =~ ^[0-9]+$ ]] && ((MAX_ARRAY_SIZE >= 1)) \
    || die "DAGSTER_GPU_SLURM_MAX_ARRAY_SIZE must be a positive integer, got '$MAX_ARRAY_SIZE'"
  mkdir -p "$D"/{etc,state,spool,log,run,dev,db,munge}
  chmod 700 "$D/etc"
  CPUS="$(nproc)"
  MEM_MB="$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)"
  # 4 GPU tasks (plus a preempting high-QOS job) must fit however few CPUs the host has.
  OVERSUBSCRIBE=$(( (8 + CPUS - 1) / CPUS ))
  ((OVERSUBSCRIBE >= 4)) || OVERSUBSCRIBE=4
  if [ ! -s "$D/etc/db.pass" ]; then
    (umask 077; od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$D/etc/db.pass")
  fi
  DB_PASS="$(cat "$D/etc/db.pass")"
  for i in 0 1 2 3; do
    if [ ! -c "$D/dev/nvidia$i" ]; then
      rm -f "$D/dev/nvidia$i"
      mknod "$D/dev/nvidia$i" c 195 "$i"
    fi
  done
  CONF_CHANGED=0
  if render "$HERE/slurm.conf.in" "$D/etc/slurm.conf" 644; then CONF_CHANGED=1; fi
  if render "$HERE/gres.conf.in" "$D/etc/gres.conf" 644; then CONF_CHANGED=1; fi
  local i
  for ((i = 0; i < ${#RENDER_EXTRA[@]}; i += 2)); do
    if render "${RENDER_EXTRA[i]}" "${RENDER_EXTRA[i + 1]}" 644; then CONF_CHANGED=1; fi
  done
  DBD_CONF_CHANGED=0
  if render "$HERE/slurmdbd.conf.in" "$D/etc/slurmdbd.conf" 600; then DBD_CONF_CHANGED=1; fi
}

# ---------------------------------------------------------------- daemons
# wait_for <what> <timeout-s> <command...>: poll every 0.2 s until the command succeeds.
wait_for() {
  local what="$1" limit="$2"; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then die "timed out after ${limit}s waiting for $what"; fi
    sleep 0.2
  done
}

pidfile() { echo "$D/run/$1.pid"; }

# alive <name> <expected comm>: the pid in our pid file is running and is that program.
alive() {
  local f pid comm
  f="$(pidfile "$1")"
  [ -s "$f" ] || return 1
  pid="$(cat "$f")"
  [ -d "/proc/$pid" ] || return 1
  comm="$(cat "/proc/$pid/comm" 2>/dev/null || true)"
  [ "$comm" = "$2" ]
}

stop_one() {
  local name="$1" comm="$2" pid i
  if alive "$name" "$comm"; then
    pid="$(cat "$(pidfile "$name")")"
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do
      [ -d "/proc/$pid" ] || break
      sleep 0.1
    done
    if [ -d "/proc/$pid" ]; then
      log "$name ($pid) did not stop on SIGTERM in 10s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    log "stopped $name ($pid)"
  fi
  rm -f "$(pidfile "$name")"
}

# Early readers (`| grep -q`, `| head`) would fail the pipeline with SIGPIPE under pipefail: every check
# reads the command's whole output first.
ctld_up() { grep -q 'is UP' <<<"$(scontrol ping 2>&1)"; }

start_slurmctld() {
  alive slurmctld slurmctld && return 0
  dg_step "starting slurmctld${DAEMON_PLACE:-}" "$D/log/slurmctld.log"
  launch slurmctld /usr/sbin/slurmctld -D -f "$SLURM_CONF"
  wait_for "slurmctld (scontrol ping)" "$TIMEOUT" ctld_up
  log "slurmctld up (pid $(cat "$(pidfile slurmctld)"))"
}

# node_state: the node's state (first line of sinfo), empty when sinfo cannot answer.
node_state() {
  local out
  out="$(sinfo --noheader -N -n "$HOST" -o '%T' 2>/dev/null)" || return 0
  echo "${out%%$'\n'*}"
}

node_ready() { [[ "$(node_state)" =~ ^(idle|mixed|allocated|completing)$ ]]; }

start_slurmd() {
  alive slurmd slurmd && return 0
  dg_step "starting slurmd${DAEMON_PLACE:-}" "$D/log/slurmd.log"
  launch slurmd /usr/sbin/slurmd -D -N "$HOST" -f "$SLURM_CONF"
  log "slurmd started (pid $(cat "$(pidfile slurmd)"))"
}

wait_node() {
  dg_step "waiting for node $HOST to be idle" "$D/log"
  local deadline=$((SECONDS + TIMEOUT)) st
  while :; do
    st="$(node_state)"
    [[ "$st" =~ ^(idle|mixed|allocated|completing)$ ]] && break
    if [[ "$st" =~ ^(down|drained|draining|inval) ]] && ((SECONDS > 3)); then
      # A restart can leave the node DOWN from the previous config; ReturnToService=2 normally clears it.
      scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true
    fi
    if ((SECONDS >= deadline)); then
      sinfo -N -l >&2 || true
      scontrol show node "$HOST" >&2 || true
      die "node $HOST not ready after ${TIMEOUT}s (state '${st:-none}')"
    fi
    sleep 0.3
  done
  log "node $HOST is $st"
}

cluster_registered() { grep -qx "$CLUSTER" <<<"$(sacctmgr -n -P show cluster format=cluster)"; }

account_known_to_ctld() {
  grep -q "Account=$ACCOUNT" <<<"$(scontrol show assoc_mgr users=root accounts="$ACCOUNT" flags=assoc)"
}

ensure_associations() {
  dg_step "registering cluster $CLUSTER, QOS and account $ACCOUNT in slurmdbd" "$D/log/slurmdbd.log"
  wait_for "cluster $CLUSTER registered in slurmdbd" "$TIMEOUT" cluster_registered
  local q
  q="$(sacctmgr -n -P show qos format=name)"
  for qos in high preemptible; do
    grep -qx "$qos" <<<"$q" || sacctmgr -i add qos "$qos" >/dev/null
  done
  # preemptible: batch work on lent GPUs, as README "Sharing GPUs with online inference" sets it up
  sacctmgr -i modify qos where name=preemptible set Priority=0 GraceTime=20 PreemptMode=requeue >/dev/null || true
  sacctmgr -i modify qos where name=high set Priority=1000 Preempt=normal,preemptible PreemptMode=requeue >/dev/null || true
  sacctmgr -i modify qos where name=normal set Priority=0 >/dev/null || true
  if ! grep -qx "$ACCOUNT" <<<"$(sacctmgr -n -P show account format=account)"; then
    sacctmgr -i add account "$ACCOUNT" Cluster="$CLUSTER" Description=dagster-gpu Organization=dagster-gpu >/dev/null
  fi
  if ! grep -qx root <<<"$(sacctmgr -n -P show assoc where user=root account="$ACCOUNT" format=user)"; then
    sacctmgr -i add user root Account="$ACCOUNT" Cluster="$CLUSTER" QOS=normal,high,preemptible DefaultQOS=normal >/dev/null
    sacctmgr -i modify user root set DefaultAccount="$ACCOUNT" >/dev/null || true
  fi
  sacctmgr -i modify user root where account="$ACCOUNT" set QOS=normal,high,preemptible >/dev/null || true
  # slurmctld learns associations from slurmdbd asynchronously: wait until it enforces them.
  dg_step "waiting for slurmctld to know account $ACCOUNT" "$D/log/slurmctld.log"
  wait_for "slurmctld to know account $ACCOUNT" "$TIMEOUT" account_known_to_ctld
}

restart_ctld_and_slurmd() {
  stop_one slurmd slurmd
  stop_one slurmctld slurmctld
  start_slurmctld
  start_slurmd
}

# cmd_status: each daemon's pid (from our pid files), then the node's state and sinfo; returns 0 only when
# every daemon runs and sinfo answers.
cmd_status() {
  dg_quiet
  local ok=0 n c
  for n in munged:munged mariadbd:mariadbd slurmdbd:slurmdbd slurmctld:slurmctld slurmd:slurmd ${STATUS_EXTRA:-}; do
    c="${n#*:}"; n="${n%%:*}"
    if alive "$n" "$c"; then
      echo "$n: running (pid $(cat "$(pidfile "$n")"))"
    else
      echo "$n: not running"; ok=1
    fi
  done
  if ((ok == 0)); then
    echo "node $HOST: $(node_state)"
    sinfo -o '%P %a %D %T %G' || ok=1
  fi
  return $ok
}
