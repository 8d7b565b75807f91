# Sourced by .ci/run and scripts/test-all: makes sure what the test suites
# need is here, installing it when it is not (Postgres at 127.0.0.1:5432,
# curl, python3 with venv, Node.js with npm, cargo-nextest, moto's S3 server).

log() { printf '==> %s\n' "$*"; }

install_postgres() {
  log "installing PostgreSQL with apt"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql postgresql-contrib >/dev/null
  # A CI machine's own cluster: local connections need no password.
  local hba
  for hba in /etc/postgresql/*/main/pg_hba.conf; do
    cat >"$hba" <<'HBA'
local all all trust
host all all 127.0.0.1/32 trust
host all all ::1/128 trust
HBA
  done
}

ensure_postgres() {
  if command -v pg_isready >/dev/null && pg_isready -q -h 127.0.0.1 -p 5432; then
    log "PostgreSQL is accepting connections at 127.0.0.1:5432"
    return
  fi
  if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    install_postgres
  fi
  local version
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  log "starting PostgreSQL $version"
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  # A server the package installer already started must re-read pg_hba.conf.
  pg_ctlcluster --skip-systemctl-redirect "$version" main reload || true
  for _ in $(seq 1 30); do
    if pg_isready -q -h 127.0.0.1 -p 5432; then
      log "PostgreSQL is up"
      return
    fi
    sleep 1
  done
  echo "PostgreSQL did not come up at 127.0.0.1:5432" >&2
  exit 1
}

# The binary's tests run the README quickstart with bash and curl; a test
# runs the README's Python signing example; schemathesis and the generated
# Python client run in venvs; the generated TypeScript needs Node.js.
ensure_tools() {
  local missing=()
  command -v curl >/dev/null || missing+=(curl)
  command -v python3 >/dev/null || missing+=(python3)
  python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
  command -v npm >/dev/null || missing+=(nodejs npm)
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]} with apt"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

ensure_nextest() {
  if ! cargo nextest --version >/dev/null 2>&1; then
    log "installing cargo-nextest"
    cargo install cargo-nextest --locked
  fi
}

# The S3 blob store's tests run against moto's S3-compatible server
# (narad-testkit starts one per test from target/moto-venv).
MOTO_REQUIREMENT='moto[server]==5.2.5'
ensure_moto() {
  local venv=target/moto-venv
  if [ -x "$venv/bin/moto_server" ] && [ -f "$venv/.requirement" ] &&
     [ "$(cat "$venv/.requirement")" = "$MOTO_REQUIREMENT" ]; then
    return
  fi
  log "installing $MOTO_REQUIREMENT into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$MOTO_REQUIREMENT"
  echo "$MOTO_REQUIREMENT" > "$venv/.requirement"
}

# Everything the suites need, installed or started when missing.
ensure_test_tools() {
  ensure_postgres
  ensure_tools
  ensure_nextest
  ensure_moto
  # The tests create their databases on the machine's server (narad-testkit).
  export NARAD_TEST_DATABASE_URL="${NARAD_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
}
