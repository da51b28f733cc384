#!/usr/bin/env bash
# rustfmt, clippy (all targets, warnings are errors) and rustdoc (broken links are errors,
# in the public docs and in the private items' docs that describe the protocols).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
(cd fuzz && cargo fmt -- --check) # its own workspace
cargo clippy --workspace --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --document-private-items --quiet
