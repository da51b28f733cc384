#!/usr/bin/env bash
# Soak (examples/soak.rs): every primitive at once for SOAK_SECS seconds (default 90 in
# CI; the example's own default is 5 minutes) with Umem as the global allocator; the
# example checks that the resident set stays flat after its warm-up, that every count is
# exact and that the heap's invariants hold, and fails otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
export SOAK_SECS=${SOAK_SECS:-90}
cargo build --release --example soak
out=$(mktemp)
trap 'rm -f "$out"' EXIT
target/release/examples/soak | tee "$out"
if [[ -n ${CI_SUMMARY:-} ]]; then
    echo "soak: $(grep '^ok in' "$out")" >>"$CI_SUMMARY"
fi
