#!/usr/bin/env bash
# The shop page's real-browser test: headless Debian chromium + playwright-core.
#
#   tests/browser/run.sh --install      install what the test needs, if missing, and stop
#   tests/browser/run.sh                build the shop, start it on a temporary SQLite
#                                       database (a slow payment provider, every order
#                                       event published three times), run the test
#                                       normally, with --expect-broken and with
#                                       --expect-broken-payment, stop the shop
#   tests/browser/run.sh URL [--expect-broken | --expect-broken-payment]
#                                       run the test against a shop already running at URL
#
# Installs when missing: the npm packages (npm ci, from package-lock.json) and
# /usr/bin/chromium (apt-get install -y chromium; needs root or sudo). It never
# runs `npx playwright install`: the test uses the system's chromium.
# SCREENSHOT=path saves the page once orders are paid and their points shown
# (e.g. SCREENSHOT=docs/screenshot.png).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
chromium="${CHROMIUM:-/usr/bin/chromium}"

install_deps() {
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "run.sh: node and npm are needed (Node.js 20 or newer), e.g. apt-get install -y nodejs npm" >&2
    exit 1
  fi
  if [ ! -f "$here/node_modules/playwright-core/package.json" ]; then
    echo "run.sh: installing playwright-core (npm ci)" >&2
    (cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
  fi
  if [ ! -x "$chromium" ]; then
    echo "run.sh: installing Debian's chromium (apt-get install -y chromium)" >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get install -y chromium >/dev/null || {
      $sudo apt-get update >/dev/null && $sudo apt-get install -y chromium >/dev/null
    }
  fi
}

install_deps
if [ "${1:-}" = "--install" ]; then
  echo "run.sh: node $(node --version), playwright-core $(node -p "require('$here/node_modules/playwright-core/package.json').version"), $("$chromium" --version 2>/dev/null | tail -n1)"
  exit 0
fi
if [ $# -gt 0 ]; then
  exec node "$here/page.test.mjs" "$@"
fi

cargo build --quiet --manifest-path "$root/Cargo.toml" -p norepeat-shop
bin="$root/target/debug/norepeat"
tmp="$(mktemp -d)"
shop_pid=""
cleanup() {
  [ -z "$shop_pid" ] || kill "$shop_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
# The same shop settings as crates/norepeat-shop/tests/it/browser.rs.
DATABASE_URL="sqlite://$tmp/shop.db?mode=rwc" NOREPEAT_PAYMENT_LATENCY_MS=400 NOREPEAT_DUPLICATE_EVENTS=3 \
  "$bin" serve --listen 127.0.0.1:0 >"$tmp/out" 2>"$tmp/err" &
shop_pid=$!
url=""
for _ in $(seq 1 300); do
  url="$(grep -o 'http://[^[:space:]]*' "$tmp/out" 2>/dev/null | head -n1 || true)"
  [ -n "$url" ] && break
  kill -0 "$shop_pid" 2>/dev/null || { cat "$tmp/err" >&2; echo "run.sh: the shop exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { echo "run.sh: the shop did not print its address" >&2; exit 1; }

node "$here/page.test.mjs" "$url"
node "$here/page.test.mjs" "$url" --expect-broken
node "$here/page.test.mjs" "$url" --expect-broken-payment
