#!/usr/bin/env bash
# CI's check of the GPU kit (tools/gpu/README.md) on a machine without a GPU: pack.sh
# --subset builds and packs the device probe with --config=gpu_bundle; the packed probe
# starts, finds its libraries through its rpath and exits with kExitNoDevice (3) and the
# "no CUDA device" reason; run.sh reports every part skipped for that reason and exits 0.
# Where a GPU is present, the probe must pass instead. Then run.sh --rebuild rebuilds the
# probe from the commands pack.sh recorded, outside Bazel, and it must behave the same.
# Prints one line: "check_kit: ok" or what failed, and exits 0 or 1.
set -uo pipefail
cd "$(dirname "$0")/../.."

fail() { echo "check_kit: FAILED: $*"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

bash tools/gpu/pack.sh --subset --out "$work" > "$work/pack.log" 2>&1 ||
  fail "pack.sh --subset: $(tail -3 "$work/pack.log" | tr '\n' ' ')"
mkdir -p "$work/unpacked"
tar -C "$work/unpacked" -xJf "$work/tessera-gpu.tar.xz" || fail "the bundle does not unpack"
probe=$work/unpacked/tessera-gpu/bin/probe
# Only its carried libraries and the system's: no path into this checkout or Bazel's tree.
[[ $(readelf -d "$probe" | grep -E 'RPATH|RUNPATH') == *'$ORIGIN/../lib'* ]] ||
  fail "the probe's rpath is not \$ORIGIN/../lib"
OUT=$work/out bash tools/gpu/run.sh --bundle "$work/tessera-gpu.tar.xz" > "$work/run.log" 2>&1
run_rc=$?
"$probe" > "$work/probe.out" 2>&1
probe_rc=$?
if ((probe_rc == 0)); then
  ((run_rc == 0)) || fail "a GPU is present but run.sh failed: $(tail -3 "$work/run.log" | tr '\n' ' ')"
  echo "check_kit: ok (a GPU is present: the probe passed)"
  exit 0
fi
((probe_rc == 3)) || fail "the probe exited $probe_rc, expected 3 (no CUDA device): $(cat "$work/probe.out")"
grep -q "no CUDA device" "$work/probe.out" || fail "the probe's error does not say 'no CUDA device': $(cat "$work/probe.out")"
((run_rc == 0)) || fail "run.sh exited $run_rc without a GPU, expected 0: $(tail -3 "$work/run.log" | tr '\n' ' ')"
for part in probe tests bench train sanitize; do
  grep -q "^$part: skipped: no CUDA device" "$work/run.log" ||
    fail "run.sh did not report '$part: skipped: no CUDA device': $(cat "$work/run.log" | tr '\n' ' ')"
done
# The fallback: the probe rebuilt from the recorded commands (Note [Rebuilding the bundle]
# in tools/gpu/record_build.py) outside Bazel, against this checkout, still starts and
# says why there is no device. The first nvcc on PATH is a wrapper script outside the
# toolkit, as on machines with /usr/local/bin/nvcc: rebuild.py must still find the
# toolkit's headers.
nvcc=$(command -v nvcc || echo "${CUDA_PATH:-/usr/local/cuda}/bin/nvcc")
mkdir -p "$work/wrapper/bin"
printf '#!/bin/sh\nexec %s "$@"\n' "$(readlink -f "$nvcc")" > "$work/wrapper/bin/nvcc"
chmod +x "$work/wrapper/bin/nvcc"
PATH=$work/wrapper/bin:$PATH OUT=$work/out_rebuild bash tools/gpu/run.sh \
  --bundle "$work/tessera-gpu.tar.xz" --rebuild --parts probe > "$work/rebuild.log" 2>&1 ||
  fail "run.sh --rebuild exited non-zero: $(tr '\n' ' ' < "$work/rebuild.log") $(head -3 "$work/out_rebuild/rebuild.log" 2>/dev/null | cut -c1-400)"
grep -q "^rebuild: passed" "$work/rebuild.log" ||
  fail "run.sh --rebuild did not rebuild: $(tr '\n' ' ' < "$work/rebuild.log") $(tail -5 "$work/out_rebuild/rebuild.log" 2>/dev/null)"
grep -q "^probe: skipped: no CUDA device" "$work/rebuild.log" ||
  fail "the rebuilt probe did not report 'no CUDA device': $(tr '\n' ' ' < "$work/rebuild.log")"
echo "check_kit: ok (no GPU: the packed probe exits 3, every part of run.sh is skipped, and the probe rebuilt from the recorded commands does the same)"
