#!/usr/bin/env bash
# A private OpenSSH server on 127.0.0.1 for the Slurm ssh transport's tests: the "login node" in front of the
# local Slurm clusters (resources/slurm). Debian's openssh-server binary with its own config, host key, client
# key, authorized_keys, known_hosts and log under $DAGSTER_GPU_SSHD_DIR (default /tmp/dagster-gpu-sshd); the
# system's sshd and /etc/ssh are not touched. Key authentication only (no passwords), for the user running
# this script (root on the test machines: PermitRootLogin prohibit-password).
#
#   sshd.sh start|stop|status|env
#
# env prints the variables the tests read: DAGSTER_GPU_SSH_HOST, _PORT, _USER, _KEY, _KNOWN_HOSTS, _LOG.
# The log (LogLevel INFO) has one "Accepted publickey for <user>" line per TCP connection that logged in:
# the tests count them.
source "$(dirname "${BASH_SOURCE[0]}")/../lib/errtrap.sh"
DIR=${DAGSTER_GPU_SSHD_DIR:-/tmp/dagster-gpu-sshd}
PORT=${DAGSTER_GPU_SSHD_PORT:-22022}
SSHD=/usr/sbin/sshd
USER_NAME=$(id -un)

running() { [ -f "$DIR/sshd.pid" ] && kill -0 "$(cat "$DIR/sshd.pid")" 2>/dev/null; }

cmd_start() {
  [ -x "$SSHD" ] || { echo "sshd.sh: $SSHD missing (apt-get install openssh-server; scripts/setup.sh does)" >&2; exit 1; }
  if running; then echo "sshd.sh: running (pid $(cat "$DIR/sshd.pid"), port $PORT)"; return; fi
  mkdir -p "$DIR" && chmod 700 "$DIR"
  [ -f "$DIR/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C dagster-gpu-test-host -f "$DIR/host_ed25519"
  [ -f "$DIR/client_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C dagster-gpu-test-client -f "$DIR/client_ed25519"
  cp "$DIR/client_ed25519.pub" "$DIR/authorized_keys" && chmod 600 "$DIR/authorized_keys"
  echo "[127.0.0.1]:$PORT $(cut -d' ' -f1,2 "$DIR/host_ed25519.pub")" > "$DIR/known_hosts"
  # privilege separation directory sshd insists on (empty, root-owned); Debian's package makes it at boot
  [ "$(id -u)" != 0 ] || mkdir -p /run/sshd
  cat > "$DIR/sshd_config" <<CONF
ListenAddress 127.0.0.1
Port $PORT
HostKey $DIR/host_ed25519
PidFile $DIR/sshd.pid
AuthorizedKeysFile $DIR/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowUsers $USER_NAME
UsePAM no
StrictModes no
LogLevel INFO
# the master multiplexes every command of every run worker as a session on one connection
MaxSessions 64
MaxStartups 50:30:100
PrintMotd no
Subsystem sftp internal-sftp
CONF
  "$SSHD" -t -f "$DIR/sshd_config"
  "$SSHD" -f "$DIR/sshd_config" -E "$DIR/sshd.log"
  for _ in $(seq 50); do running && break; sleep 0.1; done
  running || { echo "sshd.sh: sshd did not start; $DIR/sshd.log:" >&2; tail -20 "$DIR/sshd.log" >&2; exit 1; }
  echo "sshd.sh: started (pid $(cat "$DIR/sshd.pid"), 127.0.0.1:$PORT, user $USER_NAME)"
}

cmd_stop() {
  if running; then kill "$(cat "$DIR/sshd.pid")"; echo "sshd.sh: stopped"; else echo "sshd.sh: not running"; fi
}

cmd_status() {
  if running; then echo "sshd.sh: running (pid $(cat "$DIR/sshd.pid"), port $PORT)"; else echo "sshd.sh: not running"; exit 3; fi
}

cmd_env() {
  echo "DAGSTER_GPU_SSH_HOST=127.0.0.1"
  echo "DAGSTER_GPU_SSH_PORT=$PORT"
  echo "DAGSTER_GPU_SSH_USER=$USER_NAME"
  echo "DAGSTER_GPU_SSH_KEY=$DIR/client_ed25519"
  echo "DAGSTER_GPU_SSH_KNOWN_HOSTS=$DIR/known_hosts"
  echo "DAGSTER_GPU_SSH_LOG=$DIR/sshd.log"
}

case "${1:-}" in
  start) cmd_start ;; stop) cmd_stop ;; status) cmd_status ;; env) cmd_env ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
