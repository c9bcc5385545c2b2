// 16-bit matrix products on the CPU against an f64 reference on the same 16-bit values:
// bf16 on each kernel the machine has (AMX, AVX512_BF16; Note [BF16 GEMM] in
// kernels/cpu/bf16_gemm.h) and through kernels::matmul, f16 through kernels::matmul (the
// packed f32 kernel converting as it packs, kernels/cpu/sgemm.h); every trans combination,
// shapes across the kernels' tile, pair and block edges, odd k, a batched product,
// non-contiguous operands and linear's bias. Each result is the exact product rounded once
// to the 16-bit format, up to the f32 accumulation's error.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "core/factories.h"
#include "kernels/cpu/bf16_gemm.h"
#include "kernels/matmul.h"

namespace tessera {
namespace {

Tensor half_randn(const Shape& shape, uint64_t seed, DType dtype) {
  Generator g(seed);
  return randn(shape, g).to(dtype);
}
Tensor bf16_randn(const Shape& shape, uint64_t seed) {
  return half_randn(shape, seed, DType::bf16);
}

// Checks `got` (bf16 or f16) against op(a) @ op(b) (+ bias) computed in f64 from a and b's
// values: |got - exact| <= 2^-p |exact| (one rounding to the format: p = 8 for bf16, 11 for
// f16) + 2^-20 sum_l |a_il b_lj| (the f32 sums' error, generous).
void check_product(const Tensor& got, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                   const Tensor& bias = Tensor()) {
  REQUIRE(is_half(got.dtype()));
  REQUIRE(got.dtype() == a.dtype());
  const int rounding_bits = got.dtype() == DType::bf16 ? 8 : 11;
  const Tensor a2 = trans_a ? a.transpose(-1, -2) : a;  // (..., M, K)
  const Tensor b2 = trans_b ? b.transpose(-1, -2) : b;  // (..., K, N) or (K, N)
  const int64_t m = a2.size(-2), k = a2.size(-1), n = b2.size(-1);
  const int64_t batches = a2.numel() / (m * k);
  const std::vector<double> av = a2.contiguous().to_vector<double>();
  const std::vector<double> bv = b2.contiguous().to_vector<double>();
  const std::vector<double> biasv =
      bias.defined() ? bias.to_vector<double>() : std::vector<double>();
  const std::vector<double> gv = got.to_vector<double>();
  REQUIRE(static_cast<int64_t>(gv.size()) == batches * m * n);
  int64_t bad = 0, first = -1;
  double first_got = 0, first_want = 0;
  for (int64_t t = 0; t < batches; ++t) {
    const int64_t bo = b2.dim() > 2 ? t * k * n : 0;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double exact = biasv.empty() ? 0.0 : biasv[j];
        double magnitude = std::abs(exact);
        for (int64_t l = 0; l < k; ++l) {
          const double p = av[(t * m + i) * k + l] * bv[bo + l * n + j];
          exact += p;
          magnitude += std::abs(p);
        }
        const int64_t at = (t * m + i) * n + j;
        if (!(std::abs(gv[at] - exact) <=
              std::ldexp(std::abs(exact), -rounding_bits) + std::ldexp(magnitude, -20)) &&
            bad++ == 0) {
          first = at;
          first_got = gv[at];
          first_want = exact;
        }
      }
    }
  }
  INFO(bad << " of " << gv.size() << " differ; first at " << first << ": got " << first_got
           << ", want " << first_want);
  CHECK(bad == 0);
}

// The kernels this machine runs (Note [BF16 GEMM]); empty without AVX512_BF16, where bf16
// products widen to f32 and only the matmul cases below run.
std::vector<kernels::cpu::Bf16Kernel> available_kernels() {
  std::vector<kernels::cpu::Bf16Kernel> out;
  for (auto kernel : {kernels::cpu::Bf16Kernel::amx, kernels::cpu::Bf16Kernel::avx512}) {
    if (kernels::cpu::bf16_kernel_available(kernel)) out.push_back(kernel);
  }
  return out;
}

const char* kernel_name(kernels::cpu::Bf16Kernel kernel) {
  return kernel == kernels::cpu::Bf16Kernel::amx ? "amx" : "avx512";
}

// op(a) @ op(b) by bf16_gemm on `kernel`, rounded to bf16 as matmul rounds it.
Tensor gemm_on(kernels::cpu::Bf16Kernel kernel, const Tensor& a, const Tensor& b, bool trans_a,
               bool trans_b) {
  const Tensor a2 = trans_a ? a.transpose(0, 1) : a;  // (M, K), strided
  const Tensor b2 = trans_b ? b.transpose(0, 1) : b;  // (K, N), strided
  const int64_t m = a2.size(0), k = a2.size(1), n = b2.size(1);
  std::vector<float> c(static_cast<size_t>(m * n), -1.0f);
  kernels::cpu::bf16_gemm({a2.data_ptr<BFloat16>(), a2.stride(0), a2.stride(1)},
                          {b2.data_ptr<BFloat16>(), b2.stride(0), b2.stride(1)}, c.data(), n, m, n,
                          k, nullptr, kernel);
  return from_vector(c, {m, n}).to(DType::bf16);
}

struct Dims {
  int64_t m, n, k;
};
// Across the kernels' tiles (8 x 48, 32 x 32), pairs, 32-value steps of k and blocks of k
// (768) and n (192).
const std::vector<Dims> kDims = {{1, 1, 1},       {8, 48, 2},    {9, 49, 3},    {7, 47, 5},
                                 {33, 31, 32},    {32, 64, 50},  {17, 97, 767}, {24, 193, 769},
                                 {40, 200, 1601}, {130, 64, 64}, {70, 385, 96}};

TEST_CASE("this build multiplies bf16 on AMX or AVX512_BF16 where the CPU has them",
          "[matmul][bf16]") {
  std::string names;
  for (auto kernel : available_kernels()) names += std::string(" ") + kernel_name(kernel);
  WARN("bf16 GEMM kernels here:" << (names.empty() ? " none (widened to f32)" : names)
                                 << "; matmul uses "
                                 << (names.empty()
                                         ? "f32"
                                         : kernel_name(kernels::cpu::best_bf16_kernel())));
}

TEST_CASE("each bf16 GEMM kernel, every trans combination, across its edges", "[matmul][bf16]") {
  for (auto kernel : available_kernels()) {
    uint64_t seed = 100;
    for (const Dims& d : kDims) {
      for (const bool ta : {false, true}) {
        for (const bool tb : {false, true}) {
          INFO(kernel_name(kernel) << ": m " << d.m << " n " << d.n << " k " << d.k << " trans_a "
                                   << ta << " trans_b " << tb);
          const Tensor a = bf16_randn(ta ? Shape{d.k, d.m} : Shape{d.m, d.k}, seed++);
          const Tensor b = bf16_randn(tb ? Shape{d.n, d.k} : Shape{d.k, d.n}, seed++);
          check_product(gemm_on(kernel, a, b, ta, tb), a, b, ta, tb);
        }
      }
    }
  }
}

TEST_CASE("bf16 matmul, every trans combination, across tile, pair and block edges",
          "[matmul][bf16]") {
  uint64_t seed = 1;
  for (const Dims& d : kDims) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        INFO("m " << d.m << " n " << d.n << " k " << d.k << " trans_a " << ta << " trans_b " << tb);
        const Tensor a = bf16_randn(ta ? Shape{d.k, d.m} : Shape{d.m, d.k}, seed++);
        const Tensor b = bf16_randn(tb ? Shape{d.n, d.k} : Shape{d.k, d.n}, seed++);
        check_product(kernels::matmul(a, b, ta, tb), a, b, ta, tb);
      }
    }
  }
}

TEST_CASE("bf16 matmul: batched, non-contiguous, and linear with a bias", "[matmul][bf16]") {
  const Tensor a = bf16_randn({3, 33, 70}, 50);
  const Tensor b = bf16_randn({3, 70, 52}, 51);
  check_product(kernels::matmul(a, b), a, b, false, false);
  const Tensor shared = bf16_randn({70, 52}, 52);
  check_product(kernels::matmul(a, shared), a, shared, false, false);
  // A narrow() of a wider tensor: rows with a leading dimension past their width.
  const Tensor wide = bf16_randn({33, 90}, 53);
  const Tensor x = wide.narrow(1, 10, 70);
  check_product(kernels::matmul(x, shared), x, shared, false, false);
  // linear: x W^T + bias, the forward's layout (W's rows along k).
  const Tensor w = bf16_randn({100, 70}, 54);
  const Tensor bias = bf16_randn({100}, 55);
  const Tensor tokens = bf16_randn({2, 40, 70}, 56);
  check_product(kernels::linear(tokens, w, bias), tokens, w, false, true, bias);
}

TEST_CASE("f16 matmul, every trans combination, across tile and block edges", "[matmul][f16]") {
  uint64_t seed = 200;
  for (const Dims& d : kDims) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        INFO("m " << d.m << " n " << d.n << " k " << d.k << " trans_a " << ta << " trans_b " << tb);
        const Tensor a = half_randn(ta ? Shape{d.k, d.m} : Shape{d.m, d.k}, seed++, DType::f16);
        const Tensor b = half_randn(tb ? Shape{d.n, d.k} : Shape{d.k, d.n}, seed++, DType::f16);
        check_product(kernels::matmul(a, b, ta, tb), a, b, ta, tb);
      }
    }
  }
  // Wider than one block of sums (1536 columns), in both output layouts, with a bias that
  // each block reads from its own offset.
  const Tensor x = half_randn({40, 96}, seed++, DType::f16);
  const Tensor w = half_randn({1600, 96}, seed++, DType::f16);
  const Tensor bias = half_randn({1600}, seed++, DType::f16);
  check_product(kernels::linear(x, w, bias), x, w, false, true, bias);
  const Tensor wt = half_randn({96, 1600}, seed++, DType::f16);
  check_product(kernels::matmul(x, wt), x, wt, false, false);
}

TEST_CASE("f16 matmul: batched, non-contiguous, and linear with a bias", "[matmul][f16]") {
  const Tensor a = half_randn({3, 33, 70}, 60, DType::f16);
  const Tensor b = half_randn({3, 70, 52}, 61, DType::f16);
  check_product(kernels::matmul(a, b), a, b, false, false);
  const Tensor shared = half_randn({70, 52}, 62, DType::f16);
  check_product(kernels::matmul(a, shared), a, shared, false, false);
  const Tensor wide = half_randn({33, 90}, 63, DType::f16);
  const Tensor x = wide.narrow(1, 10, 70);
  check_product(kernels::matmul(x, shared), x, shared, false, false);
  const Tensor w = half_randn({100, 70}, 64, DType::f16);
  const Tensor bias = half_randn({100}, 65, DType::f16);
  const Tensor tokens = half_randn({2, 40, 70}, 66, DType::f16);
  check_product(kernels::linear(tokens, w, bias), tokens, w, false, true, bias);
}

}  // namespace
}  // namespace tessera
