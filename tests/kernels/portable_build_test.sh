#!/usr/bin/env bash
# Compiles (syntax and types only) the sources whose CPU-feature branches the default
# -march=native build may never see: for x86-64-v3 (AVX2, no AVX-512: the GPU bundle's
# host code) and Skylake-X (AVX-512 without AVX512_BF16 or AMX).
set -euo pipefail
cd "${TEST_SRCDIR:-$PWD/..}/${TEST_WORKSPACE:-tessera}"
sources=(core/half_convert.cc kernels/cpu/bf16_gemm.cc kernels/cpu/amx_gemm.cc
  kernels/cpu/bf16_pack.cc kernels/cpu/matmul.cc kernels/cpu/sgemm.cc
  kernels/cpu/elementwise.cc kernels/cpu/blas1.cc kernels/cpu/cross_entropy.cc
  kernels/cpu/layer_norm.cc kernels/cpu/softmax.cc
  tools/perf/fma_peak.cc)
failed=0
for march in x86-64-v3 skylake-avx512; do
  for src in "${sources[@]}"; do
    if ! out=$(g++ -std=c++20 -fsyntax-only -fopenmp -march="$march" -I. -I/usr/include/eigen3 \
      "$src" 2>&1); then
      echo "FAIL: $src with -march=$march:"
      echo "$out" | grep -m 5 'error'
      failed=1
    fi
  done
  echo "compiled ${#sources[@]} sources for -march=$march"
done
exit "$failed"
