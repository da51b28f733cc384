#!/usr/bin/env bash
# rustfmt, clippy (all targets, and the loom models under loom; warnings are errors), rustdoc (broken links are errors,
# in the public docs and in the private items' docs that describe the protocols), and a
# runnable example for every public item of the library.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
(cd fuzz && cargo fmt -- --check) # its own workspace
cargo clippy --workspace --all-targets -- -D warnings
# The loom models and the library as they build under loom (a plain build compiles the
# models to nothing).
RUSTFLAGS="--cfg scalemem_loom" CARGO_TARGET_DIR=target/loom-clippy \
    cargo clippy -p scalemem-loom-tests --tests --features scalemem/loom -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --document-private-items --quiet
# A runnable example for every public item: rustdoc's (unstable) lint for the items it
# documents in place, and ci/doc_examples.sh for those of private modules re-exported
# with `pub use`, which the lint does not see.
RUSTC_BOOTSTRAP=1 RUSTDOCFLAGS="-D warnings -Zunstable-options -Zcrate-attr=feature(rustdoc_missing_doc_code_examples) -D rustdoc::missing_doc_code_examples" \
    cargo doc -p scalemem --no-deps --quiet
bash ci/doc_examples.sh
