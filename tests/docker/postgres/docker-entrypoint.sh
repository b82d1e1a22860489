#!/bin/sh
# The official image's start-up, as far as docker-compose.yml relies on it: on an empty PGDATA,
# initdb with POSTGRES_USER as superuser and POSTGRES_PASSWORD as its password, create
# POSTGRES_DB, run /docker-entrypoint-initdb.d/*.sql and *.sh in name order, then serve.
set -eu

if [ "${1:-}" = postgres ] && [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chown postgres:postgres "$PGDATA" /var/run/postgresql
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ "${1:-}" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
  user=${POSTGRES_USER:-postgres}
  db=${POSTGRES_DB:-$user}
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "docker-entrypoint: POSTGRES_PASSWORD is not set" >&2
    exit 1
  fi
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  # Local (socket) connections are trusted, as in the official image; TCP needs the password.
  initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" -E UTF8 --auth-local=trust \
    --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"

  # The set-up server listens on a private socket only, so the health check (pg_isready on
  # the default socket) stays red until the real server below is up.
  init_socket=$(mktemp -d)
  pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -k $init_socket" start >/dev/null
  export PGHOST="$init_socket" PGUSER="$user"
  if [ "$db" != postgres ]; then
    psql -v ON_ERROR_STOP=1 -q -d postgres -c "CREATE DATABASE \"$db\""
  fi
  for f in /docker-entrypoint-initdb.d/*; do
    case "$f" in
      *.sql) echo "docker-entrypoint: running $f"; psql -v ON_ERROR_STOP=1 -q -d "$db" -f "$f" ;;
      *.sh)
        echo "docker-entrypoint: sourcing $f"
        # shellcheck disable=SC1090
        . "$f"
        ;;
      *) ;;
    esac
  done
  pg_ctl -D "$PGDATA" -w -m fast stop >/dev/null
  unset PGHOST PGUSER
  rmdir "$init_socket"
  echo "docker-entrypoint: initialised $PGDATA"
fi

exec "$@"
