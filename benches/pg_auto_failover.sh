#!/bin/sh
# pg_auto_failover under load (issue 45), run by hand on one machine:
#   sudo benches/pg_auto_failover.sh [ROUNDS]
# A monitor and two nodes (Debian's postgresql-15-auto-failover) on loopback
# in a temp dir, as the postgres user; then the failover test of
# tests/it/failover.rs with the URI `pg_autoctl show uri` prints, used
# unchanged as store.url, and `pg_autoctl perform failover` as the failover.
# Everything it started is stopped and removed on exit.
set -eu
ROUNDS="${1:-3}"
BIN="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
command -v pg_autoctl >/dev/null || { echo "install postgresql-15-auto-failover"; exit 2; }
DIR="$(mktemp -d /tmp/idemgate-paf.XXXXXX)"
chown postgres: "$DIR"
as_pg() { runuser -u postgres -- env PATH="$BIN:$PATH" "$@"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cleanup() {
  for d in n1 n2 mon; do [ -d "$DIR/$d" ] && as_pg pg_autoctl stop --pgdata "$DIR/$d" >/dev/null 2>&1 || true; done
  sleep 2; pkill -u postgres -f "$DIR" 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT INT TERM
MON_PORT="$(free_port)"
as_pg pg_autoctl create monitor --pgdata "$DIR/mon" --pgport "$MON_PORT" --hostname 127.0.0.1 \
  --auth trust --no-ssl > "$DIR/mon-create.log" 2>&1
as_pg sh -c "pg_autoctl run --pgdata '$DIR/mon' > '$DIR/mon.log' 2>&1 &"
sleep 3
MON="$(as_pg pg_autoctl show uri --pgdata "$DIR/mon" --formation monitor)"
for n in 1 2; do
  as_pg pg_autoctl create postgres --pgdata "$DIR/n$n" --pgport "$(free_port)" --hostname 127.0.0.1 \
    --auth trust --no-ssl --monitor "$MON" --name "node$n" --dbname idemgate > "$DIR/n$n-create.log" 2>&1
  as_pg sh -c "pg_autoctl run --pgdata '$DIR/n$n' > '$DIR/n$n.log' 2>&1 &"
  sleep 5
done
# wait for primary + secondary
for _ in $(seq 120); do
  as_pg pg_autoctl show state --pgdata "$DIR/mon" | grep -q "secondary |  *secondary" && break
  sleep 1
done
as_pg pg_autoctl show state --pgdata "$DIR/mon"
as_pg pg_autoctl show settings --pgdata "$DIR/mon" || true
URL="$(as_pg pg_autoctl show uri --pgdata "$DIR/mon" --formation default)"
echo "store.url: $URL"
IDEMGATE_PAF_URL="$URL" \
IDEMGATE_PAF_FAILOVER="runuser -u postgres -- env PATH=$BIN:\$PATH pg_autoctl perform failover --pgdata $DIR/mon" \
IDEMGATE_PAF_ROUNDS="$ROUNDS" PGUSER=postgres \
  cargo test --release --test it failover::pg_auto_failover_under_load -- --ignored --nocapture
