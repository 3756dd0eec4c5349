#!/usr/bin/env bash
# Single-host Slurm 24.11 cluster (Debian 13 trixie's packages in a chroot), beside cluster.sh's 22.05 one.
#
#   resources/slurm/trixie.sh bootstrap   debootstrap the trixie root if missing (minbase + slurm-wlm, slurmdbd,
#                                         munge, mariadb-server; ~30 s on a fast mirror, ~800 MB), nothing else
#   resources/slurm/trixie.sh start       bootstrap if missing, mount the shared paths into the root, start
#                                         munge, MariaDB, slurmdbd, slurmctld, slurmd there, wait until the node
#                                         is idle, create QOS/account; write the client wrappers (idempotent)
#   resources/slurm/trixie.sh restart     restart slurmctld and slurmd with a freshly rendered config
#                                         (e.g. DAGSTER_GPU_SLURM_MAX_ARRAY_SIZE=101 trixie.sh restart)
#   resources/slurm/trixie.sh stop        stop the daemons this script started (pid files only), unmount
#   resources/slurm/trixie.sh restart-slurmctld | stop-slurmdbd | start-slurmdbd   as cluster.sh's
#   resources/slurm/trixie.sh stop-slurmrestd | start-slurmrestd   slurmrestd alone (a restart in the fault bench)
#   resources/slurm/trixie.sh mask-noshare   (also part of start) hide the host's no-share directory from the
#                                         compute side: an empty read-only tmpfs over <root>/host$NOSHARE_DIR
#                                         (idempotent; prints the directory); see "Nothing shared" below
#   resources/slurm/trixie.sh status      daemon pids, node state, sinfo; exit 0 only when all run
#   resources/slurm/trixie.sh env         `export SLURM_CONF=… PATH=<wrappers>:$PATH DAGSTER_GPU_SLURM_WORKER_PYTHON=…
#                                         DAGSTER_GPU_SLURMRESTD_URL=http://127.0.0.1:<rest port>`
#   resources/slurm/trixie.sh token [s] [user] [file]   a fresh JWT for slurmrestd (`scontrol token`, lifespan s,
#                                         default 1800 = Slurm's own default, for user root) on stdout, or into
#                                         file (mode 0600, replaced atomically)
#
# (the rest of this header follows the libraries it uses)
source "$(dirname "${BASH_SOURCE[0]}")/../lib/errtrap.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../lib/slurm_cluster.sh"  # daemons, waits, associations
source "$(dirname "${BASH_SOURCE[0]}")/../lib/mounts.sh"  # is_mounted, mounted_under, unmount_stale

# slurmrestd: `start` also runs Debian's slurmrestd (with slurm-wlm-jwt-plugin's auth/jwt) in the root as the
# unprivileged user `slurmrestd` (it refuses root and SlurmUser) on 127.0.0.1:<rest port>, with
# `-a rest_auth/jwt -s openapi/slurmctld,openapi/slurmdbd` and SLURM_JWT=daemon (Debian's slurmrestd.service);
# slurmctld and slurmdbd take JWTs (AuthAltTypes=auth/jwt, AuthAltParameters=jwt_key=$D/etc/jwt_hs256.key,
# 32 random bytes, 0600 root = SlurmUser), as Slurm's jwt.html sets them up.
#
# Environment:
#   DAGSTER_GPU_CACHE                    cache folder (default ~/.cache/dagster-gpu); the root is <cache>/slurm-trixie
#   DAGSTER_GPU_SLURM_TRIXIE_ROOT        the root itself (default <cache>/slurm-trixie)
#   DAGSTER_GPU_SLURM_TRIXIE_DIR         state dir (default /tmp/dagster-gpu-slurm-2411); must lie under /tmp
#   DAGSTER_GPU_SLURM_TRIXIE_MIRROR      Debian mirror (default: the first deb.debian.org-style URI of this host's
#                                        apt sources, else http://deb.debian.org/debian)
#   DAGSTER_GPU_SLURM_TRIXIE_PYTHON      the host interpreter array tasks run (default <checkout>/.venv/bin/python)
#   DAGSTER_GPU_SLURM_MAX_ARRAY_SIZE     MaxArraySize (default 1001), as for cluster.sh
#   DAGSTER_GPU_SLURM_START_TIMEOUT      seconds to wait for each daemon (default 60)
#   DAGSTER_GPU_SLURM_TRIXIE_{CTLD,SLURMD,DBD,DB,REST}_PORT   (6827 / 6828 / 6829 / 3317 / 6820)
#   DAGSTER_GPU_SLURM_TRIXIE_NOSHARE_DIR the host directory the compute side cannot see (default
#                                        /var/tmp/dagster-gpu-noshare; must not lie under /tmp or the checkout)
#
# Nothing shared: the root has its own /var/tmp (never bind-mounted), and the host root it chroots back into
# (<root>/host) gets an empty read-only tmpfs over $NOSHARE_DIR (mounted on the host side under <root>/host,
# which is rslave: nothing propagates back to the host). A Dagster host's spool under $NOSHARE_DIR is thus
# invisible to every array task, in the root and in worker-python's view alike: the nothing-shared tests
# (tests/test_slurm_rest_noshare_e2e.py) put their spool there.
#
# How the two sides meet (resources/slurm/README.md, "Slurm 24.11"): the daemons run in the root (chroot);
# the host's /tmp, the checkout, /dev, /proc and /sys are bind-mounted into it at the same paths, and the
# whole host root at <root>/host. The client commands (sbatch, squeue, …) are wrappers in $D/bin that exec
# the root's own commands (22.05 clients cannot talk to a 24.11 controller); $D/bin/worker-python, run by
# an array task inside the root, chroots back into <root>/host and execs the host interpreter with the
# same working directory and environment.
#
# The same templates as cluster.sh (slurm.conf.in, gres.conf.in, slurmdbd.conf.in) plus trixie/cgroup.conf
# (CgroupPlugin=disabled: 24.11's slurmd loads a cgroup plugin even with proctrack/linuxproc, and there is
# no cgroup hierarchy it may use here). A failure prints the step that failed and the tail of its log
# (resources/lib/errtrap.sh).

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${DAGSTER_GPU_CACHE:-$HOME/.cache/dagster-gpu}"
ROOT="${DAGSTER_GPU_SLURM_TRIXIE_ROOT:-$CACHE/slurm-trixie}"
D="${DAGSTER_GPU_SLURM_TRIXIE_DIR:-/tmp/dagster-gpu-slurm-2411}"
PY="${DAGSTER_GPU_SLURM_TRIXIE_PYTHON:-$REPO/.venv/bin/python}"
MAX_ARRAY_SIZE="${DAGSTER_GPU_SLURM_MAX_ARRAY_SIZE:-1001}"
TIMEOUT="${DAGSTER_GPU_SLURM_START_TIMEOUT:-60}"
CTLD_PORT="${DAGSTER_GPU_SLURM_TRIXIE_CTLD_PORT:-6827}"
SLURMD_PORT="${DAGSTER_GPU_SLURM_TRIXIE_SLURMD_PORT:-6828}"
DBD_PORT="${DAGSTER_GPU_SLURM_TRIXIE_DBD_PORT:-6829}"
DB_PORT="${DAGSTER_GPU_SLURM_TRIXIE_DB_PORT:-3317}"
REST_PORT="${DAGSTER_GPU_SLURM_TRIXIE_REST_PORT:-6820}"
NOSHARE_DIR="${DAGSTER_GPU_SLURM_TRIXIE_NOSHARE_DIR:-/var/tmp/dagster-gpu-noshare}"
REST_USER=slurmrestd
STATUS_EXTRA=slurmrestd:slurmrestd  # cmd_status (resources/lib/slurm_cluster.sh) reports it too
PACKAGES=(slurm-wlm slurmdbd munge mariadb-server slurmrestd slurm-wlm-jwt-plugin)
# added after the first roots were made: installed into an existing root when missing (add_packages)
LATER_PACKAGES=(slurmrestd slurm-wlm-jwt-plugin)
CLUSTER=dagstergpu
ACCOUNT=research
HOST="$(hostname -s)"
DAEMON_PLACE=" (in the root)"
export SLURM_CONF="$D/etc/slurm.conf"
unset SQUEUE_FORMAT SQUEUE_FORMAT2 SINFO_FORMAT SACCT_FORMAT SLURM_JOB_ID SLURM_ARRAY_JOB_ID || true

log() { printf '[slurm-trixie] %s\n' "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}
dg_step "${1:-} (root $ROOT, state in $D)" "$D/log"

[[ "$D" == /tmp/* ]] || { echo "DAGSTER_GPU_SLURM_TRIXIE_DIR must lie under /tmp (shared with the root), got $D" >&2; exit 2; }

# in_root <cmd...>: run a command of the trixie root (absolute path inside it), cwd /.
in_root() { chroot "$ROOT" "$@"; }

# ---------------------------------------------------------------- the root
mirror() {
  if [ -n "${DAGSTER_GPU_SLURM_TRIXIE_MIRROR:-}" ]; then echo "$DAGSTER_GPU_SLURM_TRIXIE_MIRROR"; return; fi
  local uri
  # the URIs of deb lines / URIs: fields (not comments) that serve Debian's main archive
  uri="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | grep -E '^[[:space:]]*(deb|URIs:)[[:space:]]' | grep -oE 'https?://[^ ]+/debian/?([[:space:]]|$)' \
    | sed 's/[[:space:]]*$//' || true)"
  uri="${uri%%$'\n'*}"
  echo "${uri:-http://deb.debian.org/debian}"
}

root_ready() { [ -f "$ROOT/.dagster-gpu-ready" ] && [ -x "$ROOT/usr/sbin/slurmctld" ]; }

cmd_bootstrap() {
  root_ready && return 0
  dg_step "debootstrap a trixie root into $ROOT" "$D/log/bootstrap.log"
  mkdir -p "$D/log" "$(dirname "$ROOT")"
  if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap (apt)"
    # waits for a dpkg lock another set-up step holds (scripts/test.sh runs this script in the background)
    local apt=(apt-get -o DPkg::Lock::Timeout=300)
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -qq debootstrap >>"$D/log/bootstrap.log" 2>&1 \
      || { "${apt[@]}" update -qq >>"$D/log/bootstrap.log" 2>&1
           DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -qq debootstrap >>"$D/log/bootstrap.log" 2>&1; }
  fi
  local tmp="$ROOT.partial" m t0=$SECONDS
  m="$(mirror)"
  if [ -e "$tmp" ]; then
    mounted_under "$tmp" && die "$tmp has mounts below it; unmount them (umount -R $tmp) before a new bootstrap"
    rm -rf --one-file-system "$tmp"
  fi
  if [ -e "$ROOT" ]; then  # an unfinished or older root: rebuild it (never while anything is mounted in it)
    mounted_under "$ROOT" && die "$ROOT is not a complete root but has mounts below it (run: $0 stop)"
    rm -rf --one-file-system "$ROOT"
  fi
  log "debootstrap --variant=minbase trixie from $m (log: $D/log/bootstrap.log)"
  debootstrap --variant=minbase trixie "$tmp" "$m" >>"$D/log/bootstrap.log" 2>&1
  # no init system in the root: package scripts must not try to start services
  printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"
  chmod 755 "$tmp/usr/sbin/policy-rc.d"
  dg_step "apt-get install ${PACKAGES[*]} in the trixie root" "$D/log/bootstrap.log"
  mount -t proc proc "$tmp/proc"
  local rc=0
  chroot "$tmp" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" \
    >>"$D/log/bootstrap.log" 2>&1 || rc=$?
  umount "$tmp/proc"
  ((rc == 0)) || die "apt-get install in the root failed (exit $rc)"
  chroot "$tmp" apt-get clean
  touch "$tmp/.dagster-gpu-trixie-root"
  mv "$tmp" "$ROOT"
  touch "$ROOT/.dagster-gpu-ready"
  log "trixie root ready in $((SECONDS - t0)) s: $(du -sh --one-file-system "$ROOT" | cut -f1), $(in_root /usr/sbin/slurmctld -V)"
}

# add_packages: LATER_PACKAGES into a root bootstrapped before they were in PACKAGES (idempotent; needs /proc
# mounted in the root, as after mount_all).
add_packages() {
  local p missing=()
  for p in "${LATER_PACKAGES[@]}"; do
    [[ "$(in_root /usr/bin/dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" == *"install ok installed"* ]] || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  dg_step "apt-get install ${missing[*]} into the existing trixie root" "$D/log/bootstrap.log"
  mkdir -p "$D/log"
  in_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends \
    "${missing[@]}" >>"$D/log/bootstrap.log" 2>&1 \
    || { in_root apt-get update -q >>"$D/log/bootstrap.log" 2>&1
         in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
           >>"$D/log/bootstrap.log" 2>&1; } \
    || die "apt-get install ${missing[*]} in the root failed"
  in_root apt-get clean
}

# ---------------------------------------------------------------- mounts (host paths at the same paths)

bind() {  # bind <host path> <flag>: mount host path at the same path in the root (rbind with flag r)
  local src="$1" dst="$ROOT$1"
  unmount_stale "$dst" "$src"
  is_mounted "$dst" && return 0
  mkdir -p "$dst"
  if [ "${2:-}" = r ]; then mount --rbind "$src" "$dst"; else mount --bind "$src" "$dst"; fi
  mount --make-rslave "$dst"  # nothing done in the root (an unmount) propagates back to the host
}

mount_all() {
  dg_step "bind-mounting /proc, /dev, /sys, /tmp, $REPO and the host root into $ROOT" "the output above"
  mkdir -p "$ROOT/host"
  unmount_stale "$ROOT/host" /
  if ! is_mounted "$ROOT/host"; then
    mount --rbind / "$ROOT/host"
    mount --make-rslave "$ROOT/host"
  fi
  bind /proc
  bind /dev r
  bind /sys r
  bind /tmp r
  case "$REPO" in /tmp/*) ;; *) bind "$REPO" ;; esac
  mask_noshare >/dev/null
  # the checkout must be the working directory it is on the host (sbatch calls getcwd, tasks chdir to it)
  [ "$(chroot "$ROOT" /usr/bin/env -C "$REPO" /bin/pwd 2>&1)" = "$REPO" ] && same_dir "$REPO" "$ROOT$REPO" \
    || die "$REPO is not the same directory inside $ROOT ($(grep -F " $ROOT$REPO " /proc/self/mountinfo || echo 'not mounted'))"
  # the host's name must resolve in the root as on the host (slurmd, mariadb-install-db look it up)
  cmp -s /etc/hosts "$ROOT/etc/hosts" || cp -f /etc/hosts "$ROOT/etc/hosts"
  # and its time zone: squeue/sacct print the controller's and client's local time, as on the host
  if [ -e /etc/localtime ] && ! cmp -s /etc/localtime "$ROOT/etc/localtime"; then
    rm -f "$ROOT/etc/localtime"
    cp -L /etc/localtime "$ROOT/etc/localtime"
  fi
}

# mask_noshare: an empty read-only tmpfs over <root>/host$NOSHARE_DIR (the host keeps its own directory).
mask_noshare() {
  case "$NOSHARE_DIR" in /tmp|/tmp/*|"$REPO"|"$REPO"/*|/|"") die "DAGSTER_GPU_SLURM_TRIXIE_NOSHARE_DIR=$NOSHARE_DIR lies in a path shared with the root" ;; esac
  mkdir -p "$NOSHARE_DIR"
  chmod 755 "$NOSHARE_DIR"
  is_mounted "$ROOT/host" || die "$ROOT/host is not mounted (run: $0 start)"
  if ! is_mounted "$ROOT/host$NOSHARE_DIR"; then
    mount -t tmpfs -o ro,size=64k,mode=0755 dagster-gpu-noshare "$ROOT/host$NOSHARE_DIR"
  fi
  printf '%s\n' "$NOSHARE_DIR"
}

unmount_all() {
  local p
  for p in "$REPO" /tmp /sys /dev /proc /host; do
    [ "$p" = /host ] && p="$ROOT/host" || p="$ROOT$p"
    if is_mounted "$p"; then umount -R "$p" 2>/dev/null || umount -R -l "$p"; fi
  done
}

# ---------------------------------------------------------------- client wrappers
CLIENTS=(sbatch squeue sacct sinfo scontrol scancel sacctmgr srun salloc sstat sprio sshare sreport sdiag)

write_wrappers() {
  dg_step "writing the client wrappers into $D/bin" "the output above"
  mkdir -p "$D/bin"
  local c tmp
  for c in "${CLIENTS[@]}"; do
    tmp="$(mktemp "$D/bin/.$c.XXXXXX")"
    cat >"$tmp" <<EOF
#!/bin/sh
# Slurm 24.11's $c from the trixie root $ROOT (resources/slurm/trixie.sh): same arguments, environment and
# working directory (/ when the root does not have it).
cwd="\$(pwd)"
[ -d "$ROOT\$cwd" ] || cwd=/
exec /usr/sbin/chroot "$ROOT" /usr/bin/env -C "\$cwd" /usr/bin/$c "\$@"
EOF
    chmod 755 "$tmp"
    mv -f "$tmp" "$D/bin/$c"
  done
  tmp="$(mktemp "$D/bin/.worker-python.XXXXXX")"
  cat >"$tmp" <<EOF
#!/bin/sh
# The host interpreter $PY for array tasks of the 24.11 cluster (resources/slurm/trixie.sh): inside the
# trixie root, chroot back into the host root (bind-mounted at /host) with the same working directory and
# environment; on the host itself, exec it directly.
if [ -e /.dagster-gpu-trixie-root ]; then
  exec /usr/sbin/chroot /host /usr/bin/env -C "\$(pwd)" "$PY" "\$@"
fi
exec "$PY" "\$@"
EOF
  chmod 755 "$tmp"
  mv -f "$tmp" "$D/bin/worker-python"
}

# ---------------------------------------------------------------- daemon start (pid files: resources/lib/slurm_cluster.sh)
# launch <name> <cmd...>: start a foreground daemon of the root detached (own session), record its pid
# (chroot execs the daemon, so the pid is the daemon's).
launch() {
  local name="$1"; shift
  setsid chroot "$ROOT" "$@" >>"$D/log/$name.stdout" 2>&1 </dev/null &
  echo $! >"$(pidfile "$name")"
}

# ---------------------------------------------------------------- render (resources/lib/slurm_cluster.sh)
# The 22.05 templates, with their header naming this cluster and 24.11's cgroup.conf beside them.
# @AUTH_ALT@: slurmctld and slurmdbd also take JWTs (slurmrestd's users), key $JWT_KEY (jwt_key).
JWT_KEY="$D/etc/jwt_hs256.key"
RENDER_SED=(-e "s|Slurm 22.05 cluster|Slurm 24.11 cluster (trixie.sh)|"
            -e "s|@PREEMPT_SEND_USER_SIGNAL@|PreemptParameters=send_user_signal|"
            -e "s|@AUTH_ALT@|AuthAltTypes=auth/jwt\nAuthAltParameters=jwt_key=$JWT_KEY|")
RENDER_EXTRA=("$HERE/trixie/cgroup.conf.in" "$D/etc/cgroup.conf")

# ---------------------------------------------------------------- daemons (all inside the root)
start_munge() {
  alive munged munged && return 0
  dg_step "starting munged (in the root)" "$D/munge/munged.log"
  [ -s "$ROOT/etc/munge/munge.key" ] || in_root /usr/sbin/mungekey --create --keyfile=/etc/munge/munge.key
  in_root chown munge:munge /etc/munge/munge.key "$D/munge"
  chmod 755 "$D/munge"
  rm -f "$D/munge/munge.socket.2" "$D/munge/munge.socket.2.lock"
  launch munged /usr/bin/setpriv --reuid=munge --regid=munge --init-groups \
    /usr/sbin/munged -F --force --socket="$D/munge/munge.socket.2" --pid-file="$D/munge/munged.pid" \
    --log-file="$D/munge/munged.log" --seed-file="$D/munge/munged.seed"
  wait_for "munged socket" "$TIMEOUT" in_root /usr/bin/munge -n -S "$D/munge/munge.socket.2"
  log "munged up (pid $(cat "$(pidfile munged)"))"
}

db_client() { in_root /usr/bin/mariadb --no-defaults -S "$D/mysqld.sock" -uroot "$@"; }

start_mariadb() {
  alive mariadbd mariadbd && return 0
  dg_step "starting MariaDB (in the root)" "$D/log/mariadb.log"
  if [ ! -d "$D/db/mysql" ]; then
    log "initialising MariaDB data dir"
    dg_step "initialising MariaDB's data dir (in the root)" "$D/log/mariadb-install.log"
    in_root /usr/bin/mariadb-install-db --no-defaults --user=root --skip-name-resolve --datadir="$D/db" >"$D/log/mariadb-install.log" 2>&1 \
      || die "mariadb-install-db failed (see $D/log/mariadb-install.log)"
    dg_step "starting MariaDB (in the root)" "$D/log/mariadb.log"
  fi
  launch mariadbd /usr/sbin/mariadbd --no-defaults --user=root --datadir="$D/db" --socket="$D/mysqld.sock" \
    --pid-file="$D/run/mariadbd.self.pid" --bind-address=127.0.0.1 --port="$DB_PORT" \
    --innodb-buffer-pool-size=64M --log-error="$D/log/mariadb.log" --skip-name-resolve
  wait_for "MariaDB on 127.0.0.1:$DB_PORT" "$TIMEOUT" in_root /usr/bin/mariadb-admin --no-defaults -S "$D/mysqld.sock" -uroot ping
  db_client -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
    ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS'; ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
    CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';" \
    || die "cannot create the slurm database user"
  log "MariaDB up (pid $(cat "$(pidfile mariadbd)"))"
}

sacctmgr() { in_root /usr/bin/sacctmgr "$@"; }
scontrol() { in_root /usr/bin/scontrol "$@"; }
sinfo() { in_root /usr/bin/sinfo "$@"; }

start_slurmdbd() {
  alive slurmdbd slurmdbd && return 0
  dg_step "starting slurmdbd (in the root)" "$D/log/slurmdbd.log"
  launch slurmdbd /usr/sbin/slurmdbd -D
  wait_for "slurmdbd on 127.0.0.1:$DBD_PORT" "$TIMEOUT" sacctmgr -n -P show cluster format=cluster
  log "slurmdbd up (pid $(cat "$(pidfile slurmdbd)"))"
}

# jwt_key: the HS256 key slurmctld and slurmdbd check JWTs with (32 random bytes, 0600, owned by SlurmUser root;
# Slurm's jwt.html: "dd if=/dev/random of=/var/spool/slurm/statesave/jwt_hs256.key bs=32 count=1").
jwt_key() {
  [ -s "$JWT_KEY" ] && return 0
  mkdir -p "$D/etc"
  (umask 077; dd if=/dev/urandom of="$JWT_KEY.tmp" bs=32 count=1 status=none && mv -f "$JWT_KEY.tmp" "$JWT_KEY")
}

start_slurmrestd() {
  alive slurmrestd slurmrestd && return 0
  dg_step "starting slurmrestd on 127.0.0.1:$REST_PORT as $REST_USER (in the root)" "$D/log/slurmrestd.stdout"
  in_root /usr/bin/id -u "$REST_USER" >/dev/null 2>&1 \
    || in_root /usr/sbin/useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$REST_USER"
  # slurm.conf where the unprivileged user can read it ($D/etc is 0700: it holds db.pass and the JWT key)
  mkdir -p "$D/restd"
  chmod 755 "$D/restd"
  install -m 644 "$D/etc/slurm.conf" "$D/restd/slurm.conf"
  launch slurmrestd /usr/bin/env SLURM_JWT=daemon SLURM_CONF="$D/restd/slurm.conf" /usr/bin/setpriv \
    --reuid="$REST_USER" --regid="$REST_USER" --init-groups \
    /usr/sbin/slurmrestd -a rest_auth/jwt -s openapi/slurmctld,openapi/slurmdbd "127.0.0.1:$REST_PORT"
  wait_for "slurmrestd on 127.0.0.1:$REST_PORT" "$TIMEOUT" rest_up
  log "slurmrestd up (pid $(cat "$(pidfile slurmrestd)")), $(rest_versions)"
}

# rest_up: slurmrestd answers its OpenAPI description (/openapi/v3; with rest_auth/jwt only to a user with a
# token). rest_versions: the data_parser versions it serves (its paths /slurm/v0.0.NN/...), e.g.
# v0.0.40,v0.0.41,v0.0.42 on 24.11.
rest_openapi() {
  local tok
  tok="$(scontrol token lifespan=60 username=root | sed -n 's/^SLURM_JWT=//p')"
  # the token goes through the environment, never an argv
  SLURM_JWT="$tok" python3 -c 'import os, sys, urllib.request as u
r = u.Request(sys.argv[1], headers={"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": os.environ["SLURM_JWT"]})
sys.stdout.write(u.urlopen(r, timeout=10).read().decode())' "http://127.0.0.1:$REST_PORT/openapi/v3"
}
rest_up() { rest_openapi >/dev/null; }
rest_versions() {
  rest_openapi | python3 -c 'import json, re, sys
print(",".join(sorted({m[1] for p in json.load(sys.stdin)["paths"] for m in [re.match(r"/slurm/(v0\.0\.\d+)/", p)] if m})))'
}

cmd_token() {
  need_started
  local lifespan="${1:-1800}" user="${2:-root}" out="${3:-}" tok
  tok="$(scontrol token lifespan="$lifespan" username="$user" | sed -n 's/^SLURM_JWT=//p')"
  [ -n "$tok" ] || die "scontrol token lifespan=$lifespan username=$user printed no token"
  if [ -z "$out" ]; then printf '%s\n' "$tok"; return 0; fi
  # into a file: 0600 from the start (umask), replaced atomically, never on stdout or in a log
  (umask 077; printf '%s\n' "$tok" >"$out.tmp.$$" && mv -f "$out.tmp.$$" "$out")
}

prepare() {
  cmd_bootstrap
  mount_all
  add_packages
  jwt_key
  render_all
  write_wrappers
  start_munge
  start_mariadb
  if ((DBD_CONF_CHANGED)) && alive slurmdbd slurmdbd; then
    log "slurmdbd.conf changed: restarting slurmdbd"
    stop_one slurmdbd slurmdbd
  fi
  start_slurmdbd
}

cmd_start() {
  prepare
  if ((CONF_CHANGED)) && { alive slurmctld slurmctld || alive slurmd slurmd; }; then
    log "slurm.conf changed (MaxArraySize=$MAX_ARRAY_SIZE): restarting slurmctld and slurmd"
    restart_ctld_and_slurmd
  else
    start_slurmctld
    start_slurmd
  fi
  wait_node
  ensure_associations
  if ((CONF_CHANGED)) && alive slurmrestd slurmrestd; then stop_one slurmrestd slurmrestd; fi
  start_slurmrestd
  log "cluster ready ($(in_root /usr/sbin/slurmctld -V)): eval \"\$($0 env)\"; MaxArraySize=$(scontrol show config | awk '/^MaxArraySize/ {print $3}')"
}

cmd_restart() {
  prepare
  restart_ctld_and_slurmd
  wait_node
  ensure_associations
  stop_one slurmrestd slurmrestd
  start_slurmrestd
  log "cluster restarted: MaxArraySize=$(scontrol show config | awk '/^MaxArraySize/ {print $3}')"
}

need_started() {
  [ -s "$SLURM_CONF" ] || die "no cluster under $D (run: $0 start)"
}

cmd_stop() {
  if [ -d "$D/run" ]; then
    stop_one slurmrestd slurmrestd
    stop_one slurmd slurmd
    stop_one slurmctld slurmctld
    stop_one slurmdbd slurmdbd
    stop_one mariadbd mariadbd
    stop_one munged munged
  fi
  [ -d "$ROOT" ] && unmount_all
  return 0
}

case "${1:-}" in
  bootstrap) cmd_bootstrap ;;
  start) cmd_start ;;
  restart) cmd_restart ;;
  stop) cmd_stop ;;
  restart-slurmctld) need_started; stop_one slurmctld slurmctld; start_slurmctld ;;
  stop-slurmdbd) need_started; stop_one slurmdbd slurmdbd ;;
  start-slurmdbd) need_started; start_slurmdbd ;;
  stop-slurmrestd) need_started; stop_one slurmrestd slurmrestd ;;
  start-slurmrestd) need_started; start_slurmrestd ;;
  status) cmd_status ;;
  token) shift; cmd_token "$@" ;;
  mask-noshare) need_started; mask_noshare ;;
  env)
    printf 'export SLURM_CONF=%q PATH=%q DAGSTER_GPU_SLURM_WORKER_PYTHON=%q DAGSTER_GPU_SLURMRESTD_URL=%q\n' \
      "$SLURM_CONF" "$D/bin:$PATH" "$D/bin/worker-python" "http://127.0.0.1:$REST_PORT" ;;
  *) echo "usage: $0 bootstrap|start|restart|stop|status|env|token|mask-noshare|restart-slurmctld|stop-slurmdbd|start-slurmdbd|stop-slurmrestd|start-slurmrestd" >&2; exit 2 ;;
esac
