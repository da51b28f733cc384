#!/usr/bin/env bash
# The run-time fallbacks: the same tests with membarrier refused (SeqCst fences on both
# sides), with our rseq use switched off, and with glibc's rseq registration off.
set -euo pipefail
cd "$(dirname "$0")/.."
SCALEMEM_FENCE=symmetric cargo test --workspace --tests --lib
SCALEMEM_RSEQ=0 cargo test --workspace --tests --lib
GLIBC_TUNABLES=glibc.pthread.rseq=0 cargo test --workspace --tests --lib
