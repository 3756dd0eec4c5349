#!/usr/bin/env bash
# A private PostgreSQL server for the Dagster instance (tests and remote workers).
#   resources/postgres/postgres.sh start|stop|status|env|restart
# `restart` (fault injection, bench/faults.py): pg_ctl restart -m fast of a running server, same options
# (postmaster.opts); every client connection is dropped, the data is kept.
# State: ${DAGSTER_GPU_PG_DIR:-/tmp/dagster-gpu-pg}; port ${DAGSTER_GPU_PG_PORT:-55432} on 127.0.0.1.
# The password is generated once into $DIR/password (mode 600) and never printed; `env` prints
# DAGSTER_PG_PASSWORD_FILE, and dagster.yaml reads the password from the DAGSTER_PG_PASSWORD env var.
source "$(dirname "${BASH_SOURCE[0]}")/../lib/errtrap.sh"
DIR=${DAGSTER_GPU_PG_DIR:-/tmp/dagster-gpu-pg}
PORT=${DAGSTER_GPU_PG_PORT:-55432}
# the newest installed server (sort and tail read all their input: no early exit under pipefail)
PGBIN=${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)}
DB=dagster
USER_NAME=dagster

need_pg() {
  if [ -z "$PGBIN" ] || [ ! -x "$PGBIN/postgres" ]; then
    dg_step "apt-get install postgresql"
    echo "postgres.sh: installing postgresql (apt)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  fi
}

as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

start() {
  need_pg
  dg_step "initdb in $DIR/data"
  mkdir -p "$DIR"
  # one start at a time (two test workers may ask at once): concurrent ALTER ROLEs fail ("tuple concurrently updated");
  # the server is started without fd 9 (9>&-), or it would hold the lock for its whole life
  exec 9>"$DIR/.start.lock"
  flock 9
  if [ "$(id -u)" = 0 ]; then chown postgres: "$DIR"; fi
  if [ ! -f "$DIR/data/PG_VERSION" ]; then
    umask 077
    head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' > "$DIR/password.tmp"
    mv "$DIR/password.tmp" "$DIR/password"
    chmod 600 "$DIR/password"
    as_pg "$PGBIN/initdb" -D "$DIR/data" -U postgres --auth=trust -E UTF8 >/dev/null
  fi
  if as_pg "$PGBIN/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; then
    echo "postgres already running on 127.0.0.1:$PORT"
  else
    dg_step "pg_ctl start (127.0.0.1:$PORT)" "$DIR/server.log"
    as_pg "$PGBIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -p $PORT -k $DIR -c max_connections=300 -c fsync=off" start >/dev/null 9>&-
  fi
  dg_step "creating role $USER_NAME and database $DB" "$DIR/server.log"
  local pw; pw=$(cat "$DIR/password")
  as_pg "$PGBIN/psql" -h "$DIR" -p "$PORT" -U postgres -qtA -v ON_ERROR_STOP=1 -v pw="$pw" <<SQL >/dev/null
SELECT 'CREATE ROLE $USER_NAME LOGIN' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$USER_NAME')\gexec
ALTER ROLE $USER_NAME PASSWORD :'pw' CREATEDB;
SELECT 'CREATE DATABASE $DB OWNER $USER_NAME' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$DB')\gexec
SQL
  # password auth for TCP from now on (trust only over the private socket dir)
  dg_step "pg_hba.conf: password auth over TCP" "$DIR/server.log"
  if ! grep -q "dagster-gpu" "$DIR/data/pg_hba.conf"; then
    { echo "# dagster-gpu"; echo "local all postgres trust"; echo "host all all 127.0.0.1/32 scram-sha-256"; } > "$DIR/data/pg_hba.conf"
    as_pg "$PGBIN/pg_ctl" -D "$DIR/data" reload >/dev/null
  fi
  exec 9>&-
  echo "postgres running on 127.0.0.1:$PORT (db $DB, user $USER_NAME, password in $DIR/password)"
}

stop() {
  need_pg
  if [ -f "$DIR/data/PG_VERSION" ]; then as_pg "$PGBIN/pg_ctl" -D "$DIR/data" -m fast stop >/dev/null 2>&1 || true; fi
  echo "postgres stopped"
}

restart() {
  need_pg
  dg_step "pg_ctl restart -m fast" "$DIR/server.log"
  as_pg "$PGBIN/pg_ctl" -D "$DIR/data" status >/dev/null || { echo "postgres.sh: not running (run: $0 start)" >&2; exit 1; }
  as_pg "$PGBIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -m fast -w -t 60 restart >/dev/null
  echo "postgres restarted on 127.0.0.1:$PORT"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  restart) restart ;;
  status) need_pg; dg_quiet; as_pg "$PGBIN/pg_ctl" -D "$DIR/data" status ;;
  env)
    echo "export DAGSTER_PG_HOST=127.0.0.1 DAGSTER_PG_PORT=$PORT DAGSTER_PG_DB=$DB DAGSTER_PG_USER=$USER_NAME DAGSTER_PG_PASSWORD_FILE=$DIR/password" ;;
  *) echo "usage: $0 start|stop|status|env|restart" >&2; exit 2 ;;
esac
