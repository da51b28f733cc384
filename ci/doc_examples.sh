#!/usr/bin/env bash
# Public items without a runnable example in their documentation.
#
# rustdoc's `missing_doc_code_examples` lint (ci/lint.sh) checks the items it documents
# in place, but not those of private modules re-exported with `pub use` (most of
# `epoch`, `hazard`, `ds`, ...). This scan covers the source itself: every `pub` fn,
# struct, enum, trait or union (not `pub(crate)`, not in a test module, not loom-only)
# whose doc comment has no code block is listed, and the script fails if there is any.
# Constants, statics, type aliases and fields are left out, as the lint leaves them.
# Files whose items are public only under loom are skipped (see SKIP). The `preload/`
# crate is a C library: its exported functions are documented as C's, not scanned.
set -euo pipefail
cd "$(dirname "$0")/.."
SKIP='^src/umem/(slot_table|boot|once|background)\.rs$'
status=0
while IFS= read -r file; do
    if [[ "$file" =~ $SKIP ]]; then continue; fi
    awk -v file="$file" '
        # Modules skipped whole, from `mod NAME {` to the `}` at its indentation: tests,
        # and modules that are loom-only, test-only or hidden.
        skip != "" { if ($0 == skip) skip = ""; line[NR] = ""; next }
        /^[[:space:]]*(pub(\([a-z]+\))?[[:space:]]+)?mod [a-z_0-9]+[[:space:]]*\{/ {
            hide = ($0 ~ /mod tests[[:space:]]*\{/)
            for (j = NR - 1; j > 0; j--) {
                l = line[j]
                sub(/^[[:space:]]+/, "", l)
                if (l !~ /^#\[/ && l !~ /^\/\/\//) break
                if (l ~ /cfg\(scalemem_loom\)|doc\(hidden\)|cfg\(test\)|cfg\(all\(test/) hide = 1
            }
            if (hide) { match($0, /^[[:space:]]*/); skip = substr($0, 1, RLENGTH) "}"; next }
        }
        {
            line[NR] = $0
            if ($0 ~ /^[[:space:]]*pub[[:space:]]+((const|unsafe|async|extern[[:space:]]+"C")[[:space:]]+)*(fn|struct|enum|trait|union)[[:space:]]/) {
                example = 0; loomonly = 0; hidden = 0
                for (j = NR - 1; j > 0; j--) {
                    l = line[j]
                    sub(/^[[:space:]]+/, "", l)
                    if (l ~ /^\/\/\//) { if (l ~ /```/) example = 1; continue }
                    if (l ~ /^#\[/ || l ~ /^\)\]/ || l ~ /^[a-z_]+(\(.*\))?,?$/) {
                        if (l ~ /cfg\(scalemem_loom\)/) loomonly = 1
                        if (l ~ /doc\(hidden\)/) hidden = 1
                        continue
                    }
                    break
                }
                if (!example && !loomonly && !hidden) {
                    name = $0; sub(/^[[:space:]]+/, "", name); sub(/[({<].*$/, "", name)
                    printf "%s:%d: %s\n", file, NR, name
                    missing++
                }
            }
        }
        END { exit missing > 0 }
    ' "$file" || status=1
done < <(find src -name '*.rs' | sort)
if [ "$status" -ne 0 ]; then
    echo "ci/doc_examples.sh: the public items above have no example in their documentation" >&2
fi
exit "$status"
