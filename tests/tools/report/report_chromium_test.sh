#!/bin/sh
# tools/report in a browser: the page of two synthetic runs (300 and 1200 steps, an eval every
# 50) opened in headless Chromium holds, as the browser parsed it, the 5 charts of Note
# [Report markup] with each run's train series (the 1200-step one downsampled to at most 1000
# points), both val_loss series and 2 legend entries per chart; its screenshot is a real
# picture (kept in the test's undeclared outputs). Bad arguments exit 2, a missing run 1.
set -eu

RUNFILES="${TEST_SRCDIR:-$0.runfiles}/${TEST_WORKSPACE:-tessera}"
WORK="${TEST_TMPDIR:-$(mktemp -d)}/report"
OUTPUTS="${TEST_UNDECLARED_OUTPUTS_DIR:-${TMPDIR:-/tmp}}"
REPORT="$RUNFILES/tools/report/report"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

command -v chromium >/dev/null 2>&1 ||
  fail "no chromium on PATH: chromium is installed by tools/setup.sh"
[ -x "$REPORT" ] || fail "no report binary at $REPORT"

rm -rf "$WORK"
mkdir -p "$WORK/home" "$OUTPUTS"
cd "$WORK"
# Chromium writes its profile and caches under HOME.
HOME="$WORK/home"
export HOME

# write_run DIR STEPS OFFSET: DIR/metrics.jsonl of STEPS train records (a decaying, wiggling
# loss OFFSET above 1.5, a warmup then linearly decaying lr, a grad norm, tokens/s and mfu
# OFFSET x 10% lower) and an eval every 50, so the runs' lines are apart in the screenshot.
write_run() {
  mkdir -p "$1"
  awk -v steps="$2" -v offset="$3" 'BEGIN {
    for (s = 1; s <= steps; s++) {
      printf "{\"kind\":\"train\",\"step\":%d,\"loss\":%.5f,\"lr\":%.7f,\"grad_norm\":%.4f,", \
        s, 1.5 + offset + 3 / sqrt(s) + 0.05 * sin(s), \
        (s < 100 ? s / 100 : 1 - s / (2 * steps)) * 1e-3, 1 + offset + 0.5 * cos(s / 7)
      printf "\"tokens_per_s\":%.1f,\"mfu\":%.5f,\"elapsed_s\":%.3f}\n", \
        (1 - offset / 10) * (40000 + 1000 * sin(s / 13)), (1 - offset / 10) * (0.4 + 0.01 * sin(s / 5)), s * 0.02
      if (s % 50 == 0) printf "{\"kind\":\"eval\",\"step\":%d,\"val_loss\":%.5f}\n", s, 1.6 + offset + 3 / sqrt(s)
    }
  }' >"$1/metrics.jsonl"
}

write_run runs/alpha 300 0.5
write_run runs/beta 1200 0

# The binary: bad arguments exit 2, a directory without metrics.jsonl 1, each with one line.
code=0
"$REPORT" >usage.log 2>&1 || code=$?
[ "$code" = 2 ] && grep -q '^report: expected at least one RUN_DIR$' usage.log ||
  fail "no RUN_DIR: expected exit 2 and a usage line, found $code: $(cat usage.log)"
code=0
"$REPORT" runs/missing >missing.log 2>&1 || code=$?
[ "$code" = 1 ] && grep -q '^report: error: \[report\] runs/missing/metrics.jsonl: no such file' missing.log ||
  fail "a missing run: expected exit 1 and the error, found $code: $(cat missing.log)"

PAGE="$WORK/report.html"
"$REPORT" --out "$PAGE" runs/alpha runs/beta >report.log 2>&1 || fail "report failed: $(cat report.log)"
grep -qx "report: wrote $PAGE (2 runs, 5 charts)" report.log || fail "unexpected output: $(cat report.log)"

# chromium_run ARGS...: headless Chromium on the page, its noise (D-Bus, GPU) in chromium.log.
chromium_run() {
  timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
    --user-data-dir="$WORK/profile" "$@" "file://$PAGE" 2>>chromium.log
}

chromium_run --dump-dom >dom.html || fail "chromium --dump-dom failed: $(tail -n 5 chromium.log)"

# count PATTERN [FILE]: occurrences (not lines) of the fixed string PATTERN in FILE (dom.html).
count() {
  grep -oF -- "$1" "${2:-dom.html}" | wc -l | tr -d ' '
}

# expect WHAT WANT GOT
expect() {
  [ "$3" = "$2" ] || fail "$1: expected $2, found $3"
}

expect 'charts' 5 "$(count '<svg class="chart"')"
expect 'train series (5 charts x 2 runs)' 10 "$(count '<path class="series" ')"
expect 'alpha train series of 300 points' 5 "$(count '<path class="series" data-run="alpha" data-points="300"')"
expect 'val series' 2 "$(count '<path class="series val"')"
expect 'alpha val series of 6 points' 1 "$(count '<path class="series val" data-run="alpha" data-points="6"')"
expect 'beta val series of 24 points' 1 "$(count '<path class="series val" data-run="beta" data-points="24"')"
expect 'legend entries (5 charts x 2 runs)' 10 "$(count '<g class="legend-entry"')"
# beta's 1200 points are downsampled: at most 1000 per path, and more than half of them.
for n in $(grep -oE '<path class="series" data-run="beta" data-points="[0-9]+"' dom.html |
  sed 's/.*data-points="\([0-9]*\)"/\1/'); do
  [ "$n" -le 1000 ] && [ "$n" -gt 500 ] || fail "beta train series: expected 501..1000 points, found $n"
done

# Per chart, in page order: its title, 2 train series (loss: and 2 val), 2 legend entries, ticks.
for metric in loss lr grad_norm tokens_per_s mfu; do
  sed -n "/<svg class=\"chart\" data-metric=\"$metric\"/,/<\/svg>/p" dom.html >"chart_$metric.svg"
  grep -q "<title>$metric" "chart_$metric.svg" || fail "$metric: no chart with a <title>"
  expect "$metric: train series" 2 "$(count '<path class="series" ' "chart_$metric.svg")"
  expect "$metric: legend entries" 2 "$(count '<g class="legend-entry"' "chart_$metric.svg")"
  ticks=$(count '<text class="tick"' "chart_$metric.svg")
  [ "$ticks" -ge 6 ] || fail "$metric: expected at least 6 tick labels, found $ticks"
done
expect 'loss: val series' 2 "$(count '<path class="series val"' chart_loss.svg)"
order=$(grep -o 'data-metric="[a-z_]*"' dom.html | tr '\n' ' ')
expect 'chart order' 'data-metric="loss" data-metric="lr" data-metric="grad_norm" data-metric="tokens_per_s" data-metric="mfu" ' "$order"

SHOT="$OUTPUTS/report.png"
rm -f "$SHOT"
chromium_run --hide-scrollbars --window-size=1200,2400 --screenshot="$SHOT" >/dev/null ||
  fail "chromium --screenshot failed: $(tail -n 5 chromium.log)"
[ -f "$SHOT" ] || fail "no screenshot at $SHOT"
bytes=$(wc -c <"$SHOT" | tr -d ' ')
[ "$bytes" -gt 10240 ] || fail "the screenshot is $bytes bytes; expected a picture of over 10 KB"
echo "ok: 5 charts, 10 train and 2 val series, 10 legend entries in Chromium's DOM; $SHOT $bytes bytes"
