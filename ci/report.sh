#!/usr/bin/env bash
# The scaling runner's report, checked in a real browser: a short quick-mode run
# (examples/scale, threads 1 and 2, 0.05 s cells), then index.html opened in headless
# Chromium. The check reads the DOM Chromium dumps after running the page, not the file:
# each group's <figure> must hold an <svg> that the browser laid out with a nonzero size,
# with data polylines (class="series", as the runner tags them) of nonzero length for
# every implementation of the group (the page's own script writes data-rendered-series,
# data-rendered-lines and data-rendered-size from getTotalLength, getBBox and
# getBoundingClientRect). A screenshot is kept beside the report.
#
# Needs chromium (Debian package `chromium`); installs it with apt-get when running as
# root and it is missing. Fails, saying so, when it cannot.
# Usage: ci/report.sh [extra arguments for the runner]
set -euo pipefail
cd "$(dirname "$0")/.."

out=target/scale-report-ci
# group id and how many implementations its plot has a line for
groups=(reclaim-read:7 reclaim-update:7 stalled-garbage:5 refcount:6 rwlock:4 floors:4 alloc:5)

if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "ci/report.sh: installing chromium"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
            || { echo "ci/report.sh: FAILED: apt-get could not install chromium (network?)" >&2; exit 1; }
    else
        echo "ci/report.sh: FAILED: chromium is not installed (Debian: apt-get install -y chromium)" >&2
        exit 1
    fi
fi
chromium --version

start=$(date +%s)
rm -rf "$out"
cargo run --release --example scale -- --secs 0.05 --threads 1,2 --reps 2 --out "$out" "$@"
echo "ci/report.sh: runner (build + run) took $(( $(date +%s) - start )) s"

index="$PWD/$out/index.html"
browse() {
    # Chromium's own chatter (dbus, GPU) goes to stderr; keep it out of the log unless it fails.
    timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
        --window-size=1000,3000 "$@" "file://$index" 2>"$out/chromium.log" \
        || { echo "ci/report.sh: FAILED: chromium exited with $?" >&2; cat "$out/chromium.log" >&2; exit 1; }
}
browse --dump-dom >"$out/dom.html"
browse --screenshot="$PWD/$out/screenshot.png" >/dev/null

failed=0
fail() { echo "ci/report.sh: FAILED: $*" >&2; failed=1; }

grep -q 'data-render-check="done"' "$out/dom.html" || fail "the page's render-check script did not run"
for entry in "${groups[@]}"; do
    group=${entry%%:*}
    want=${entry##*:}
    # The group's figure, from its opening tag to its closing tag, as Chromium serialized it.
    figure=$(awk -v id="id=\"plot-$group\"" 'index($0, id) { on = 1 } on { print } on && /<\/figure>/ { exit }' \
        "$out/dom.html")
    [ -n "$figure" ] || { fail "$group: no figure in the rendered DOM"; continue; }
    grep -q '<svg' <<<"$figure" || { fail "$group: no <svg> in its figure"; continue; }
    in_svg=$(grep -c '<polyline[^>]*class="series"' <<<"$figure" || true)
    attr() { grep -o "data-rendered-$1=\"[0-9x]*\"" <<<"$figure" | cut -d'"' -f2 || true; }
    series=$(attr series)
    lines=$(attr lines)
    size=$(attr size)
    echo "ci/report.sh: $group: svg ${size:-?} px; ${lines:-?} of $in_svg data polylines rendered with a length," \
        "from ${series:-?} series (want $want)"
    [ -n "$series" ] && [ "$series" -ge "$want" ] || fail "$group: fewer than $want plotted series rendered"
    case "$size" in
        0x* | *x0 | "") fail "$group: the svg has no rendered size" ;;
    esac
done
[ -s "$out/screenshot.png" ] || fail "no screenshot"
[ -s "$out/results.json" ] || fail "no results.json"
[ "$failed" = 0 ] || exit 1
echo "ci/report.sh: every group's plot rendered in headless Chromium ($out/index.html, $out/screenshot.png);" \
    "$(( $(date +%s) - start )) s in all"
