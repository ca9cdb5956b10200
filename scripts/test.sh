#!/usr/bin/env bash
# Runs every norepeat test against real services.
#
# On a fresh Debian machine, as root, it installs what is missing
# (redis-server, PostgreSQL, NATS, Chromium, Node.js, Python, Tomcat 10 and
# a JDK, cargo-nextest, Schemathesis) from Debian's packages, crates.io and PyPI,
# starts PostgreSQL, Redis and NATS (with JetStream) if they are not running,
# and installs the browser test's npm packages, all but cargo-nextest while
# the tests build. Then it runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."

started=$SECONDS
# A skipped check must not be reported as passed: the variable that once made
# the schemathesis runs pass without running is refused, not honoured.
if [ -n "${NOREPEAT_SKIP_SCHEMATHESIS:-}" ]; then
  echo "NOREPEAT_SKIP_SCHEMATHESIS is set: the test command runs every check; unset it" >&2
  echo "(to leave the fuzz runs out of a run of your own: cargo nextest run -E 'not test(/^schemathesis::/)')" >&2
  exit 2
fi
# Each step says when it starts, counted from the script's start, so a slow
# run shows where its time went.
log() { printf '==> [%4ds] %s\n' "$((SECONDS - started))" "$*" >&2; }

# What the build needs: cargo-nextest and clippy.
if ! cargo nextest --version >/dev/null 2>&1; then
  log "installing cargo-nextest"
  cargo install cargo-nextest --locked
fi
clippy_driver="$(rustc --print sysroot)/bin/clippy-driver"
if [ ! -x "$clippy_driver" ]; then
  log "clippy is missing: rustup component add clippy"
  exit 1
fi

# What the tests need, prepared beside the build (which needs none of it):
# on a machine without the packages, their installation (a minute here)
# then costs no time; on a fresh clone, neither do the npm and PyPI
# packages (13 s). Its output is printed once the build is done.
mkdir -p target
prepare_log=target/prepare.log
prepared_env=target/prepare.env
: >"$prepared_env"
prepare() {
  # 1. Packages.
  missing=()
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v pg_ctlcluster >/dev/null || missing+=(postgresql)
  [ -x /usr/sbin/nats-server ] || command -v nats-server >/dev/null || missing+=(nats-server)
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  command -v node >/dev/null || missing+=(nodejs)
  command -v npm >/dev/null || missing+=(npm)
  command -v python3 >/dev/null || missing+=(python3)
  python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
  # The gateway's Tomcat test (crates/norepeat-gateway/tests/it/tomcat.rs)
  # starts Tomcat instances of its own and compiles their servlet with javac.
  [ -f /usr/share/tomcat10/bin/bootstrap.jar ] || missing+=(tomcat10)
  command -v javac >/dev/null || missing+=(default-jdk-headless)
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
  fi
  # Where systemd runs, the package starts its own Tomcat on port 8080: the
  # test needs none of it, and it would hold the port and the memory.
  if command -v systemctl >/dev/null && systemctl is-active --quiet tomcat10 2>/dev/null; then
    log "stopping Debian's tomcat10 service (the tests start their own)"
    systemctl disable --now tomcat10 || true
  fi

  # 2. PostgreSQL running, reachable on 127.0.0.1:5432 by the test kit.
  pg_up() { pg_isready -q -h 127.0.0.1 -p 5432; }
  if ! pg_up; then
    log "starting PostgreSQL"
    for v in /etc/postgresql/*; do
      pg_ctlcluster --skip-systemctl-redirect "$(basename "$v")" main start || true
    done
    for _ in $(seq 1 30); do pg_up && break; sleep 1; done
  fi
  if [ -z "${NOREPEAT_TEST_PG_ADMIN_URL:-}" ] \
    && ! psql "postgres://postgres@127.0.0.1:5432/postgres" -qAtc 'select 1' >/dev/null 2>&1; then
    # A stock Debian cluster asks for a password over TCP: give the postgres
    # role one (local peer auth lets root do this) and tell the kit.
    log "PostgreSQL wants a password over TCP: setting one for the postgres role"
    su postgres -c "psql -qc \"ALTER ROLE postgres PASSWORD 'postgres'\"" >/dev/null
    echo "export NOREPEAT_TEST_PG_ADMIN_URL=postgres://postgres:postgres@127.0.0.1:5432/postgres" >"$prepared_env"
  fi

  # 3. Redis: tests start private servers on free ports; the shared one on
  #    6379 is started for completeness (the README's examples use it).
  if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    log "starting Redis on 127.0.0.1:6379"
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log
  fi

  # 4. NATS with JetStream on 127.0.0.1:4222 (the order-event tests).
  if ! (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null; then
    log "starting NATS with JetStream on 127.0.0.1:4222"
    mkdir -p /var/lib/nats-server
    nats=$(command -v nats-server || echo /usr/sbin/nats-server)
    start-stop-daemon --start --oknodo --background --exec "$nats" -- \
      -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
    for _ in $(seq 1 30); do (exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null && break; sleep 1; done
  fi

  # 5. The browser test's packages.
  if [ ! -d tests/browser/node_modules ] && [ -f tests/browser/package.json ]; then
    log "installing the browser test's npm packages"
    (cd tests/browser && npm ci --no-audit --no-fund)
  fi

  # 6. Schemathesis (PyPI) for the API fuzz test (crates/norepeat-shop/tests/it/schemathesis.rs)
  #    and Flask for the gateway's introspection test (crates/norepeat-gateway/tests/flask_app.py),
  #    in the git-ignored .venv/.
  if ! .venv/bin/schemathesis --version >/dev/null 2>&1 || ! .venv/bin/python -c 'import flask' 2>/dev/null; then
    log "installing schemathesis and flask into .venv/"
    python3 -m venv .venv
    .venv/bin/pip install -q 'schemathesis==4.32.5' 'flask==3.1.3'
  fi
}
log "preparing the machine beside the build (packages, services; its output: $prepare_log)"
(prepare) >"$prepare_log" 2>&1 </dev/null &
prepare_pid=$!

# 7. The suite.
# One build for the lints and the tests: the workspace's crates are compiled
# by clippy's driver with warnings denied, in the very build the tests run
# from (lib, bins, tests, examples; the benches below). Given as cargo
# `--config`, not as environment, so the cargo that the tests start
# themselves (trybuild's) builds as a user's would.
lint=(--config "build.rustc-workspace-wrapper=\"$clippy_driver\"" --config 'build.rustflags=["-D", "warnings"]')
log "build: the workspace's tests, with clippy's lints, warnings denied"
cargo nextest run --workspace --all-features --no-run "${lint[@]}" "$@"
log "waiting for the machine's preparation"
if ! wait "$prepare_pid"; then
  cat "$prepare_log" >&2
  log "failed: preparing the machine (above)"
  exit 1
fi
cat "$prepare_log" >&2
# shellcheck disable=SC1090
[ -s "$prepared_env" ] && . "$prepared_env"

# The checks that compile (clippy under each feature set, `cargo package`)
# run beside the tests, in a target directory of their own (so that they
# never hold the tests' build lock) and at the lowest CPU priority: they
# fill the cores the tests leave idle (most tests wait on a failover, a
# lease, a browser or a process) and yield them to any test that wants
# them. Run beside the tests at the normal priority, they starved the
# tests that count effects under load.
checks_log=target/checks.log
checks() {
  renice -n 19 -p "$BASHPID" >/dev/null
  export CARGO_TARGET_DIR=target/checks
  # The library under each feature set a user can pick alone builds
  # without a warning, its tests included (a test that needs a store is
  # gated on its feature). Every feature together is linted by the build
  # above; these are the others that change which code is compiled.
  for features in "" redis postgres sqlite; do
    log "clippy: the library and its tests with features [${features}] only"
    cargo clippy -p norepeat --lib --tests --no-default-features ${features:+--features "$features"} -- -D warnings
  done
  # What is published builds on its own, from the packaged files alone.
  log "cargo package: the published crates, verified"
  cargo package -p norepeat-macros -p norepeat --allow-dirty "${lint[@]}"
  log "checks done"
}
mkdir -p target
log "checks: started beside the tests, at the lowest CPU priority (their output: $checks_log)"
(checks) >"$checks_log" 2>&1 < /dev/null &
checks_pid=$!

failed=()
log "cargo nextest run"
cargo nextest run --workspace --all-features --no-fail-fast "${lint[@]}" "$@" || failed+=(tests)
log "benches: built with clippy's lints (not run: see BENCHMARKS.md)"
cargo test --workspace --all-features --benches --no-run "${lint[@]}" || failed+=(benches)
log "doc tests"
cargo test --workspace --all-features --doc "${lint[@]}" || failed+=("doc tests")
log "waiting for the checks"
wait "$checks_pid" || failed+=(checks)
cat "$checks_log" >&2
if [ ${#failed[@]} -gt 0 ]; then
  log "failed: ${failed[*]}"
  exit 1
fi
log "done"
