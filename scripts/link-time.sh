#!/usr/bin/env bash
# How much of the test build is linking: builds what `./scripts/test.sh`
# builds (the workspace's tests, with clippy's lints) in a target directory
# of its own, through a linker that times each link, then prints the
# build's wall time, each link and their sum. Give `--touch` to time a
# rebuild after a change to the library instead (the first run builds the
# directory; the rebuild then recompiles the library and what depends on
# it, and relinks every test binary).
#
#   ./scripts/link-time.sh            # from scratch (about as long as the test build)
#   ./scripts/link-time.sh --touch    # a rebuild after an edit of the library
set -euo pipefail
cd "$(dirname "$0")/.."

dir=target/link-time
mkdir -p "$dir"
log=$(realpath "$dir")/links.log
linker=$(realpath "$dir")/timed-cc
# rustc calls the linker it is given as it would call `cc`, with the same
# arguments (rust-lld among them, through `-fuse-ld=lld`, on Linux).
cat >"$linker" <<'EOF'
#!/usr/bin/env bash
start=$(date +%s%N)
cc "$@"
rc=$?
end=$(date +%s%N)
out=?
prev=
for a in "$@"; do
  [ "$prev" = "-o" ] && out=$a
  prev=$a
done
printf '%d %s\n' "$(((end - start) / 1000000))" "$(basename "$out")" >>"$LINK_TIMES_LOG"
exit $rc
EOF
chmod +x "$linker"

clippy_driver="$(rustc --print sysroot)/bin/clippy-driver"
build() {
  CARGO_TARGET_DIR=$dir LINK_TIMES_LOG=$log cargo nextest run --workspace --all-features --no-run \
    --config "build.rustc-workspace-wrapper=\"$clippy_driver\"" --config 'build.rustflags=["-D", "warnings"]' \
    --config "target.$(rustc -vV | sed -n 's/^host: //p').linker=\"$linker\"" >/dev/null 2>&1
}

if [ "${1:-}" = "--touch" ]; then
  [ -d "$dir/debug" ] || build
  touch crates/norepeat/src/lib.rs
fi
: >"$log"
started=$(date +%s%N)
build
wall=$((($(date +%s%N) - started) / 1000000))

sort -rn "$log" | awk -v wall="$wall" '
  { total += $1; n++; printf "%8.2f s  %s\n", $1 / 1000, $2 }
  END {
    printf "%d links, %.1f s in all (the build took %.1f s of wall time on %d cores)\n",
      n, total / 1000, wall / 1000, '"$(nproc)"'
  }'
