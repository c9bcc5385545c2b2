#!/usr/bin/env bash
# Runs the GPU bundle of tools/gpu/pack.sh on a GPU machine (no Bazel needed) and writes a
# summary and one log per part to $OUT (default .gpu/out): at most 7 files.
#
#   bash tools/gpu/run.sh [--bundle FILE] [--parts LIST] [--filter REGEX] [--test-timeout S]
#                         [--rebuild]
#
#   --bundle FILE      the packed bundle (default .gpu/tessera-gpu.tar.xz)
#   --parts LIST       comma-separated; they run in this order (default all):
#                        probe     versions, devices, libraries, one kernel per device
#                        tests     every gpu test; a failing one again under CUDA_LAUNCH_BLOCKING=1
#                                  (not one that timed out)
#                        bench     cuda_kernels_bench, gpt2_gpu_bench (with PyTorch's reference),
#                                  and overlap_bench on this machine's CPU cores
#                        train     the README's CUDA run (configs/shakespeare_char_cuda.json),
#                                  the same with dropout 0.2 (shakespeare_char_cuda_dropout.json),
#                                  its ZeRO-3 twin (shakespeare_char_cuda_zero3.json), its
#                                  ZeRO-Offload twin (stage 2, the optimizer on the host:
#                                  shakespeare_char_cuda_offload.json) and its 2-stage
#                                  pipeline of 2 tensor slices
#                                  (shakespeare_char_cuda_3d.json, 4 thread ranks sharing the
#                                  GPU), each then generating from its checkpoint
#                        sanitize  compute-sanitizer memcheck on the kernel tests, racecheck on
#                                  attention and the reductions (the slowest part)
#   --filter REGEX     only the tests whose binary name matches (tests and sanitize)
#   --test-timeout S   seconds per test binary (default 300)
#   --rebuild          rebuild the binaries here first (tools/gpu/rebuild.py), as run.sh
#                      does by itself when the carried ones cannot load their libraries
#
# Each part reports "passed", "failed" or "skipped: <why>" (no device, libraries missing).
# Exit code: 0 when no part failed (skipped parts included), 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

bundle=.gpu/tessera-gpu.tar.xz
parts=probe,tests,sanitize,bench,train
filter=.
test_timeout=300
rebuild=0
while (($#)); do
  case $1 in
    --bundle) bundle=$2; shift 2 ;;
    --parts) parts=$2; shift 2 ;;
    --filter) filter=$2; shift 2 ;;
    --test-timeout) test_timeout=$2; shift 2 ;;
    --rebuild) rebuild=1; shift ;;
    *) echo "run.sh: unknown argument '$1': expected --bundle, --parts, --filter, --test-timeout or --rebuild" >&2; exit 2 ;;
  esac
done
for p in ${parts//,/ }; do
  [[ $p =~ ^(probe|tests|sanitize|bench|train)$ ]] ||
    { echo "run.sh: unknown part '$p': expected probe, tests, sanitize, bench or train" >&2; exit 2; }
done
[[ -f $bundle ]] || { echo "run.sh: expected the bundle at $bundle (bash tools/gpu/pack.sh makes it), found nothing" >&2; exit 2; }

out=${OUT:-$repo/.gpu/out}
mkdir -p "$out"
summary=$out/summary.txt
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
wants() { [[ ,$parts, == *,$1,* ]]; }
exit_no_device=3  # tools/cli/flags.h kExitNoDevice

work=$(mktemp -d)
# xz may be missing where Python is not: its tarfile reads .tar.xz too.
tar -C "$work" -xJf "$bundle" 2>/dev/null ||
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$bundle" "$work" ||
  { echo "run.sh: could not unpack $bundle (tar -xJ and python3's tarfile failed)" >&2; exit 2; }
root=$work/tessera-gpu
bin=$root/bin
say "tessera GPU kit: bundle of $(head -c 12 "$root/COMMIT") $(sed -n 2p "$root/COMMIT"), $(date -u +%FT%TZ)"

# ---- libraries: CUDA's own may live only inside Python wheels (nvidia-*-cu13) -------------
lib_dirs=()
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [[ -d $d ]] && lib_dirs+=("$d"); done
py_nvidia=$(python3 -c 'import nvidia, sys; print("\n".join(nvidia.__path__))' 2>/dev/null)
for base in $py_nvidia; do
  while IFS= read -r d; do lib_dirs+=("$d"); done < <(find "$base" -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u)
done
ld_path=$(IFS=:; echo "${lib_dirs[*]}")
export LD_LIBRARY_PATH=${ld_path}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
missing_libraries() {
  for b in "$bin"/*; do [[ -x $b && ! $b == *.py ]] && ldd "$b" 2>/dev/null | awk '/not found/ {print $1}'; done | sort -u | tr '\n' ' '
}
missing=$(missing_libraries)
failed_parts=0

# ---- rebuild: from the recorded commands, when the carried binaries cannot load ---------
if ((rebuild)) || [[ -n $missing ]]; then
  why=$([[ -n $missing ]] && echo "libraries not found: $missing" || echo "asked for (--rebuild)")
  start=$SECONDS
  if python3 "$repo/tools/gpu/rebuild.py" "$root" "$repo" > "$out/rebuild.log" 2>&1; then
    missing=$(missing_libraries)
    say "rebuild: passed in $((SECONDS - start)) s ($why)${missing:+; still missing: $missing}"
  else
    say "rebuild: FAILED ($why): $(grep -m1 'rebuild.py' "$out/rebuild.log" | cut -c1-300)"
    failed_parts=$((failed_parts + 1))
  fi
fi

skip_reason=""
if [[ -n $missing ]]; then
  skip_reason="libraries not found: $missing(searched: $ld_path)"
fi

# ---- probe ------------------------------------------------------------------------------
if wants probe; then
  log=$out/probe.log
  {
    echo "== nvidia-smi"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || echo "nvidia-smi: not available"
    echo "== nvcc"; nvcc --version 2>&1 | tail -2 || echo "nvcc: not on PATH"
    echo "== python3 torch"; python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -1
    echo "== compute-sanitizer"; command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>&1
    echo "== CPU"; grep -m1 'model name' /proc/cpuinfo; grep -m1 -o -w 'avx512f\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' '; echo; nproc
    echo "== library dirs"; printf '%s\n' "${lib_dirs[@]}"
    echo "== libraries the binaries load"; ldd "$bin/train" "$bin/cuda_kernels_bench" 2>&1 | grep -E 'cublas|nccl|cudnn|not found' | sort -u
    echo "== probe"
  } > "$log" 2>&1
  if [[ -n $skip_reason ]]; then
    say "probe: failed: $skip_reason"
    failed_parts=$((failed_parts + 1))
  else
    "$bin/probe" >> "$log" 2>&1
    rc=$?
    grep -E '^(CUDA runtime|cuda:)' "$log" | sed 's/^/  /' | tee -a "$summary" >/dev/null
    if ((rc == exit_no_device)); then
      skip_reason=$(grep -m1 '^probe: error: ' "$log" | sed 's/^probe: error: \[probe\] //')
      say "probe: skipped: $skip_reason"
    elif ((rc != 0)); then
      say "probe: failed (exit $rc): $(grep -m1 'error' "$log")"
      failed_parts=$((failed_parts + 1))
    else
      say "probe: passed"
    fi
  fi
fi
# Without the probe part, still find out whether a device is there.
if [[ -z $skip_reason ]] && ! wants probe; then
  "$bin/probe" > /dev/null 2>&1
  (($? == exit_no_device)) && skip_reason="no CUDA device (gpu probe exit $exit_no_device)"
fi

# run_one NAME LOG TIMEOUT CMD...: runs CMD with its output in LOG.last, then appended to
# LOG; returns CMD's exit code (137 when killed at TIMEOUT seconds).
run_one() {
  local name=$1 log=$2 limit=$3; shift 3
  local start=$SECONDS
  timeout --signal=KILL "$limit" "$@" > "$log.last" 2>&1
  local rc=$?
  { echo "==== $name: $*"; cat "$log.last"; echo "==== $name: exit $rc in $((SECONDS - start)) s"; } >> "$log"
  return $rc
}

test_binaries=()
for b in "$bin"/*_test; do
  [[ $(basename "$b") =~ $filter ]] && test_binaries+=("$b")
done

# ---- tests ------------------------------------------------------------------------------
if wants tests; then
  log=$out/tests.log; : > "$log"
  if [[ -n $skip_reason ]]; then
    say "tests: skipped: $skip_reason"
  else
    passed=0; failed=0; skipped=0; failures=""
    for b in "${test_binaries[@]}"; do
      name=$(basename "$b")
      tmp=$(mktemp -d)
      start=$SECONDS
      TEST_TMPDIR=$tmp run_one "$name" "$log" "$test_timeout" "$b"
      rc=$?
      if ((rc == 0)); then
        passed=$((passed + 1)); say "  $name: passed ($((SECONDS - start)) s)"
      elif ((rc == exit_no_device)); then
        skipped=$((skipped + 1)); say "  $name: skipped (no device)"
      else
        failed=$((failed + 1)); failures+=" $name"
        what=$([[ $rc == 137 ]] && echo "timed out after $test_timeout s" || echo "exit $rc")
        say "  $name: FAILED ($what); first failure: $(grep -m1 -E 'FAILED|error|terminate' "$log.last" | cut -c1-200)"
        if ((rc == 137)); then
          # A hang would hang again: the rerun would only spend the device's time.
          say "    not rerun under CUDA_LAUNCH_BLOCKING=1 (it timed out)"
        else
          rm -rf "$tmp"; tmp=$(mktemp -d)
          TEST_TMPDIR=$tmp CUDA_LAUNCH_BLOCKING=1 run_one "$name (CUDA_LAUNCH_BLOCKING=1)" "$log" "$test_timeout" "$b"
          say "    again under CUDA_LAUNCH_BLOCKING=1: exit $?"
        fi
      fi
      rm -rf "$tmp"
    done
    say "tests: $passed passed, $failed failed, $skipped skipped${failures:+ (failed:$failures)}"
    ((failed)) && failed_parts=$((failed_parts + 1))
  fi
fi

# ---- bench ------------------------------------------------------------------------------
if wants bench; then
  log=$out/bench.log; : > "$log"
  if [[ -n $skip_reason ]]; then
    say "bench: skipped: $skip_reason"
  else
    bad=0
    run_one cuda_kernels_bench "$log" 180 "$bin/cuda_kernels_bench" || bad=$((bad + 1))
    # 300 s: torch.compile's compilation of the reference takes a minute or two.
    run_one gpt2_gpu_bench "$log" 300 "$bin/gpt2_gpu_bench" --torch-script "$bin/gpt2_gpu_torch.py" || bad=$((bad + 1))
    # A CPU bench: its 4 thread ranks, one OpenMP thread each, get a core each here, which
    # the 2-core dev box cannot give them (README's overlap section).
    run_one overlap_bench "$log" 240 "$bin/overlap_bench" || bad=$((bad + 1))
    grep -E "one step's GEMMs|^  (forward|backward) |copy bandwidth|reference.* unavailable|^step ms|^tokens/s|^MFU|^PyTorch |^tessera: |^  torch.compile:|ours / torch.compile|^overlap_bench:|^stage +\||^[0-9](,[0-9],[0-9])? +\||^\(compute:" "$log" | sed 's/^/  /' >> "$summary"
    say "bench: $([[ $bad == 0 ]] && echo passed || echo "$bad FAILED")"
    ((bad)) && failed_parts=$((failed_parts + 1))
  fi
fi

# ---- train ------------------------------------------------------------------------------
if wants train; then
  log=$out/train.log; : > "$log"
  if [[ -n $skip_reason ]]; then
    say "train: skipped: $skip_reason"
  else
    bad=0
    for run in shakespeare_char_cuda shakespeare_char_cuda_dropout shakespeare_char_cuda_zero3 shakespeare_char_cuda_offload shakespeare_char_cuda_3d; do
      before=$bad
      start=$SECONDS
      ranks=()
      [[ $run == *_3d ]] && ranks=(--thread-ranks 4)
      (cd "$root" && run_one train "$log" 300 "$bin/train" --config "configs/$run.json" ${ranks[@]+"${ranks[@]}"}) || bad=$((bad + 1))
      say "  $run: exit $([[ $bad == "$before" ]] && echo 0 || echo nonzero) in $((SECONDS - start)) s; last: $(grep -iE 'val' "$log" | tail -1)"
      (cd "$root" && run_one generate "$log" 120 "$bin/generate" --checkpoint ".runs/$run/checkpoints" --tokens 200) || bad=$((bad + 1))
    done
    say "train: $([[ $bad == 0 ]] && echo passed || echo "$bad FAILED")"
    ((bad)) && failed_parts=$((failed_parts + 1))
  fi
fi

# ---- sanitize ---------------------------------------------------------------------------
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
# The sanitizer exits 99 (--error-exitcode) when it reports errors, else with the test's code.
sanitizer_outcome() {
  case $1 in
    0) echo passed ;;
    99) echo "FAILED: the sanitizer reported errors" ;;
    137) echo "FAILED: timed out" ;;
    *) echo "FAILED: the test failed under the sanitizer (exit $1), no sanitizer errors" ;;
  esac
}
if wants sanitize; then
  log=$out/sanitize.log; : > "$log"
  if [[ -n $skip_reason ]]; then
    say "sanitize: skipped: $skip_reason"
  elif [[ ! -x $sanitizer ]]; then
    say "sanitize: skipped: compute-sanitizer not found"
  else
    bad=0
    # memcheck: every kernel family, out-of-bounds and misaligned accesses, leaks of cudaMalloc.
    for name in kernels_parity_test nn_kernels_parity_test index_kernels_parity_test \
                optim_kernels_parity_test block_sparse_parity_test signs_parity_test; do
      [[ -x $bin/$name && $name =~ $filter ]] || continue
      args=()
      # The sign kernels' past-the-cap cases move gigabytes: too slow under memcheck.
      [[ $name == signs_parity_test ]] && args=("GPU sign pack and unpack equal the CPU's")
      tmp=$(mktemp -d)
      TEST_TMPDIR=$tmp run_one "memcheck $name" "$log" "$test_timeout" \
        "$sanitizer" --tool memcheck --error-exitcode 99 --print-limit 20 "$bin/$name" "${args[@]}"
      rc=$?; rm -rf "$tmp"
      say "  memcheck $name: $(sanitizer_outcome $rc)"
      ((rc)) && bad=$((bad + 1))
    done
    # racecheck: shared-memory races in attention and the block reductions.
    for spec in "nn_kernels_parity_test|causal_attention and its backward match an f64 CPU reference" \
                "nn_kernels_parity_test|softmax, log_softmax and their backward match the CPU" \
                "nn_kernels_parity_test|layer_norm and its backward match the CPU, with and without affine" \
                "kernels_parity_test|sum and var match the CPU" \
                "optim_kernels_parity_test|squared_norm matches the CPU and reports non-finite values"; do
      name=${spec%%|*}; case_name=${spec#*|}
      [[ -x $bin/$name && $name =~ $filter ]] || continue
      tmp=$(mktemp -d)
      TEST_TMPDIR=$tmp run_one "racecheck $name: $case_name" "$log" "$test_timeout" \
        "$sanitizer" --tool racecheck --error-exitcode 99 --print-limit 20 "$bin/$name" "$case_name"
      rc=$?; rm -rf "$tmp"
      say "  racecheck $name \"$case_name\": $(sanitizer_outcome $rc)"
      ((rc)) && bad=$((bad + 1))
    done
    say "sanitize: $([[ $bad == 0 ]] && echo passed || echo "$bad FAILED")"
    ((bad)) && failed_parts=$((failed_parts + 1))
  fi
fi

rm -rf "$work" "$out"/*.last
say "parts failed: $failed_parts"
exit $((failed_parts > 0))
