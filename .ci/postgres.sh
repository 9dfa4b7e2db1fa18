#!/usr/bin/env bash
# Start a throwaway PostgreSQL server on loopback for the shared-storage tests.
# Usage: eval "$(bash .ci/postgres.sh)"   -> exports AUTOTUNE_TEST_POSTGRES
set -euo pipefail
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >&2
fi
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
port=${AUTOTUNE_PG_PORT:-55432}
while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done  # in use
data=$(mktemp -d /tmp/autotune-pg.XXXXXX)
runas=()
if [ "$(id -u)" = 0 ]; then  # the server refuses to run as root
  chown postgres "$data"
  runas=(su postgres -s /bin/sh -c)
else
  runas=(sh -c)
fi
"${runas[@]}" "$bin/initdb -D $data -A trust -U postgres" >/dev/null
# The superuser (AUTOTUNE_TEST_POSTGRES) needs no password; any other role does over TCP,
# so the credentials tests see a password really asked for.
cat >"$data/pg_hba.conf" <<'HBA'
local all all trust
host all postgres 127.0.0.1/32 trust
host all all 127.0.0.1/32 scram-sha-256
HBA
if [ "$(id -u)" = 0 ]; then chown postgres "$data/pg_hba.conf"; fi
"${runas[@]}" "$bin/pg_ctl -D $data -l $data/log -w -o '-p $port -k /tmp -c listen_addresses=127.0.0.1' start" >/dev/null
echo "export AUTOTUNE_TEST_POSTGRES=postgresql+psycopg2://postgres@127.0.0.1:$port/postgres"
echo "export AUTOTUNE_PG_STOP='${runas[*]} \"$bin/pg_ctl -D $data -m fast stop\"'"
