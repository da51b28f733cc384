#!/usr/bin/env bash
# The run-time fallbacks: the same tests with membarrier's fast side turned off by a
# setting (SeqCst fences on both sides), with our rseq use switched off, with glibc's
# rseq registration off, and under a seccomp filter that refuses the membarrier and rseq
# system calls (ci/seccomp_deny.c), where only the kernel's refusal selects the fallbacks.
set -euo pipefail
cd "$(dirname "$0")/.."
SCALEMEM_FENCE=symmetric cargo test --workspace --tests --lib
SCALEMEM_RSEQ=0 cargo test --workspace --tests --lib
GLIBC_TUNABLES=glibc.pthread.rseq=0 cargo test --workspace --tests --lib
# Build first, outside the filter (the tests are what must run under it).
cargo test --workspace --tests --lib --no-run
mkdir -p target/ci-tools
cc -O2 -Wall -Wextra -Werror -o target/ci-tools/seccomp_deny ci/seccomp_deny.c
SCALEMEM_EXPECT_REFUSED=1 target/ci-tools/seccomp_deny membarrier rseq -- cargo test --workspace --tests --lib
