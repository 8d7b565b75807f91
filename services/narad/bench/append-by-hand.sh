#!/usr/bin/env bash
# The append a user would write by hand (append-by-hand.sql), measured with
# pgbench on a scratch database: one table of sessions with a sequence, one
# of events and one outbox, each with its primary key alone. Prints
# pgbench's summary; BENCHMARKS.md runs it beside `narad bench append`.
#
#   services/narad/bench/append-by-hand.sh [server-url] [clients] [seconds]
#   (defaults: postgres://postgres@127.0.0.1:5432/postgres, 32, 10)
set -euo pipefail
URL="${1:-postgres://postgres@127.0.0.1:5432/postgres}"
CLIENTS="${2:-32}"
SECONDS_="${3:-10}"
DB="narad_hand_$$"
HERE="$(cd "$(dirname "$0")" && pwd)"
BASE="${URL%/*}"
psql -X -q -v ON_ERROR_STOP=1 "$URL" -c "create database $DB"
trap 'psql -X -q "$URL" -c "drop database if exists $DB" >/dev/null' EXIT
psql -X -q -v ON_ERROR_STOP=1 "$BASE/$DB" <<SQL
create table hand_sessions (id int primary key, seq bigint not null default 0);
insert into hand_sessions (id) select generate_series(1, $CLIENTS);
create table hand_events (session_id int not null, seq bigint not null, body jsonb not null,
  primary key (session_id, seq));
create table hand_outbox (position bigint generated always as identity primary key,
  session_id int not null, seq bigint not null);
analyze;
SQL
pgbench -n -M prepared -c "$CLIENTS" -j 2 -T "$SECONDS_" -D sessions="$CLIENTS" \
  -f "$HERE/append-by-hand.sql" "$BASE/$DB" 2>&1 | grep -E "tps|latency|clients|transactions"
