#!/usr/bin/env bash
# The README's test command: unit, integration and doc tests of the whole workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test "$@"
