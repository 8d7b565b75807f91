# Sourced by the CI scripts that need a running narad: a fresh database on
# the test Postgres, `narad serve` on a port the kernel picks, and cleanup
# on exit. `test_server_binary` alone only finds or builds the binary. After
# `test_server_start NAME`:
#   NARAD   the binary, an absolute path (a debug build, unless $NARAD_BIN names one)
#   BASE    the server's URL
#   WORK    a scratch directory, removed on exit
#   test_server_token ROLES...  prints a token of the test tenant
#
# Environment (optional):
#   NARAD_TEST_DATABASE_URL  the test Postgres (default postgres://postgres@127.0.0.1:5432/postgres)
#   NARAD_BIN                a narad binary to use instead of building one

TEST_SERVER_ADMIN_URL="${NARAD_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
TEST_SERVER_SECRET="ci-test-server-hs256-secret-of-32-bytes-or-more"
TEST_SERVER_PID=""
TEST_SERVER_DB=""
WORK=$(mktemp -d)

test_server_psql() { psql -X -q -v ON_ERROR_STOP=1 "$TEST_SERVER_ADMIN_URL" -c "$1" >/dev/null; }

test_server_cleanup() {
  if [ -n "$TEST_SERVER_PID" ] && kill -0 "$TEST_SERVER_PID" 2>/dev/null; then
    kill -TERM "$TEST_SERVER_PID" 2>/dev/null || true
    wait "$TEST_SERVER_PID" 2>/dev/null || true
  fi
  if [ -n "$TEST_SERVER_DB" ]; then
    test_server_psql "drop database if exists $TEST_SERVER_DB with (force)" || true
  fi
  rm -rf "$WORK"
}
trap test_server_cleanup EXIT

# test_server_binary: sets NARAD to $NARAD_BIN, or builds narad and sets it
# to the debug build (an absolute path either way).
test_server_binary() {
  if [ -n "${NARAD_BIN:-}" ]; then
    NARAD="$NARAD_BIN"
  else
    # The same features as the test build before it (`--tests` unifies the
    # dev-dependencies' features): after `cargo nextest run --workspace`
    # this builds nothing.
    cargo build --quiet --workspace --tests
    NARAD=target/debug/narad
  fi
  NARAD=$(realpath "$NARAD")
}

# test_server_start NAME: builds narad (unless NARAD_BIN), makes database
# narad_NAME_<pid>_<time>, and serves it; the server's log is $WORK/server.log.
test_server_start() {
  local name="$1"
  test_server_binary
  TEST_SERVER_DB="narad_${name}_$$_$(date +%s)"
  test_server_psql "create database $TEST_SERVER_DB"
  export NARAD_JWT_HS256_SECRET="$TEST_SERVER_SECRET"
  NARAD_LISTEN=127.0.0.1:0 NARAD_DATABASE_URL="${TEST_SERVER_ADMIN_URL%/*}/$TEST_SERVER_DB" \
    NARAD_HOME="$WORK/home" RUST_LOG=warn \
    "$NARAD" serve >"$WORK/stdout" 2>"$WORK/server.log" &
  TEST_SERVER_PID=$!
  BASE=""
  for _ in $(seq 1 120); do
    BASE=$(sed -n 's/^narad is serving on //p' "$WORK/stdout" | head -n 1)
    [ -n "$BASE" ] && return 0
    if ! kill -0 "$TEST_SERVER_PID" 2>/dev/null; then
      cat "$WORK/stdout" "$WORK/server.log" >&2
      echo "narad serve exited before serving" >&2
      return 1
    fi
    sleep 0.5
  done
  cat "$WORK/stdout" "$WORK/server.log" >&2
  echo "narad serve did not start within 60 s" >&2
  return 1
}

# test_server_token SUB ROLES: a token of the tenant `ci` for SUB with the
# comma-separated ROLES.
test_server_token() {
  "$NARAD" token --org ci --sub "$1" --roles "$2"
}
