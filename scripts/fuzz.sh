#!/usr/bin/env bash
# Runs the fuzz targets briefly (default 30 s each): the frame decoder, the whole request decoder
# (frame, envelope, stateless checks, fragment merge), and same-node reads of any runs of client
# memory. Needs a nightly toolchain and cargo-fuzz; installs cargo-fuzz if missing. Without nightly
# it says so and leaves the check to the stable property-test twins (run by `make test`).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${FUZZ_SECONDS:-30}"
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz: no nightly toolchain; skipped (the proptest twin ran in make test)"
    exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install -q --locked cargo-fuzz || { echo "fuzz: cargo-fuzz could not be installed; skipped"; exit 0; }
fi
for target in frame_decode request_decode same_node_read; do
    cargo +nightly fuzz run "$target" -- -max_total_time="$SECS" -rss_limit_mb=2048 2>&1 | tail -5
done
