#include "kernels/dropout.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/factories.h"
#include "core/philox.h"
#include "kernels/cpu/dropout.h"

namespace tessera {
namespace {

using kernels::dropout;
using kernels::dropout_backward;

// keep(i) for the row-major elements [0, n), straight from the Philox definition.
std::vector<bool> reference_mask(int64_t n, double p, uint64_t seed, uint64_t offset) {
  std::vector<bool> keep(n);
  for (int64_t i = 0; i < n; ++i) {
    const std::array<uint32_t, 4> words = philox4x32(offset + i / 4, 0, seed);
    keep[i] = uniform_from_bits(words[i % 4]) >= static_cast<float>(p);
  }
  return keep;
}

}  // namespace

TEST_CASE("dropout keeps the Philox mask and scales by 1 / (1 - p)", "[dropout]") {
  Generator gen(1);
  const double p = 0.3;
  struct Stream {
    uint64_t seed, offset;
  };
  // The last stream's counters cross 2^32, where the carry reaches the second word.
  for (const Stream s : {Stream{1234, 17}, Stream{0x0123456789ABCDEFull, 0xFFFFFFF0ull}}) {
    for (DType dtype : {DType::f32, DType::f64}) {
      for (const Shape& shape : {Shape{3, 7}, Shape{1001}}) {  // partial blocks and groups
        const Tensor x = randn(shape, gen, {dtype});
        const Tensor y = dropout(x, p, s.seed, s.offset);
        REQUIRE(y.shape() == x.shape());
        REQUIRE(y.dtype() == dtype);
        const std::vector<bool> keep = reference_mask(x.numel(), p, s.seed, s.offset);
        const std::vector<double> xv = x.to_vector<double>();
        const std::vector<double> yv = y.to_vector<double>();
        const double tol = dtype == DType::f32 ? 1e-6 : 1e-15;
        for (size_t i = 0; i < xv.size(); ++i) {
          REQUIRE(yv[i] == Approx(keep[i] ? xv[i] / (1 - p) : 0.0).margin(tol));
        }
      }
    }
  }
}

TEST_CASE("dropout drops a fraction near p of many elements", "[dropout]") {
  const int64_t n = 1 << 20;
  const Tensor x = ones({n});
  for (double p : {0.1, 0.5, 0.9}) {
    const std::vector<double> y = dropout(x, p, 42, 0).to_vector<double>();
    int64_t dropped = 0;
    int64_t wrong_scale = 0;
    for (double v : y) {
      if (v == 0.0) {
        ++dropped;
      } else if (std::abs(v - 1 / (1 - p)) > 1e-6 / (1 - p)) {
        ++wrong_scale;
      }
    }
    REQUIRE(wrong_scale == 0);
    // The standard deviation of the fraction is below 0.0005 at this n.
    REQUIRE(static_cast<double>(dropped) / n == Approx(p).margin(0.005));
  }
}

TEST_CASE("dropout backward applies the forward mask", "[dropout]") {
  Generator gen(2);
  const Tensor x = randn({5, 129}, gen);
  const Tensor dy = randn({5, 129}, gen);
  const double p = 0.25;
  const std::vector<double> y = dropout(x, p, 7, 1000).to_vector<double>();
  const std::vector<double> dx = dropout_backward(dy, p, 7, 1000).to_vector<double>();
  const std::vector<double> dyv = dy.to_vector<double>();
  for (size_t i = 0; i < y.size(); ++i) {
    if (y[i] == 0.0) {
      REQUIRE(dx[i] == 0.0);
    } else {
      REQUIRE(dx[i] == Approx(dyv[i] / (1 - p)).epsilon(1e-6));
    }
  }
}

TEST_CASE("dropout is a function of (seed, offset)", "[dropout]") {
  const Tensor x = ones({4096});
  const std::vector<double> a = dropout(x, 0.5, 9, 100).to_vector<double>();
  REQUIRE(dropout(x, 0.5, 9, 100).to_vector<double>() == a);
  REQUIRE(dropout(x, 0.5, 9, 101).to_vector<double>() != a);
  REQUIRE(dropout(x, 0.5, 10, 100).to_vector<double>() != a);
  // Offsets count 4-element blocks: offset + 1 shifts the mask by four elements.
  const std::vector<double> shifted = dropout(x, 0.5, 9, 101).to_vector<double>();
  REQUIRE(std::vector<double>(a.begin() + 4, a.end()) ==
          std::vector<double>(shifted.begin(), shifted.end() - 4));
}

TEST_CASE("dropout of a non-contiguous tensor masks the row-major elements", "[dropout]") {
  Generator gen(3);
  const Tensor x = randn({9, 5}, gen, {DType::f64}).transpose(0, 1);  // (5, 9)
  REQUIRE_FALSE(x.is_contiguous());
  REQUIRE(dropout(x, 0.4, 5, 3).to_vector<double>() ==
          dropout(x.contiguous(), 0.4, 5, 3).to_vector<double>());
}

TEST_CASE("dropout_keep_rows gives rows of dropout's mask from any element", "[dropout]") {
  // The fused attention's mask blocks (Note [Attention-probability dropout] in
  // kernels/attention.h): starts inside a Philox block, rows of one element to many lane
  // groups (64 blocks each), several rows per lane group, and counters that carry into the
  // high word.
  for (const uint64_t offset : {uint64_t{0}, uint64_t{0xFFFFFFF0}}) {
    const int64_t n = 1800;
    const std::vector<double> mask =
        kernels::dropout(full({n}, 1.0, {DType::f64}), 0.35, 77, offset).to_vector<double>();
    for (const int64_t first : {0, 1, 2, 3, 5, 259, 1001}) {
      for (const int64_t count : {1, 3, 64, 255, 257, 700}) {
        // One row of `count`, then rows of at most 64 (the attention's) `count` apart.
        const int64_t cols = std::min<int64_t>(count, 64), ld = 70;
        const int64_t rows = count == 1 ? 1 : (n - first - cols) / count + 1;
        std::vector<uint8_t> row(static_cast<size_t>(count), 2);
        std::vector<uint8_t> block(static_cast<size_t>(rows * ld), 2);
        kernels::cpu::dropout_keep_rows(77, offset, static_cast<uint64_t>(first), 0, 1, count, 0.35,
                                        row.data(), count);
        kernels::cpu::dropout_keep_rows(77, offset, static_cast<uint64_t>(first),
                                        static_cast<uint64_t>(count), rows, cols, 0.35,
                                        block.data(), ld);
        const auto kept = [&](int64_t e) { return mask[static_cast<size_t>(e)] != 0.0 ? 1 : 0; };
        int64_t mismatches = 0;
        for (int64_t e = 0; e < count; ++e)
          mismatches += row[static_cast<size_t>(e)] != kept(first + e);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            mismatches += block[static_cast<size_t>(r * ld + c)] != kept(first + r * count + c);
          }
        }
        INFO("offset " << offset << ", first " << first << ", count " << count);
        CHECK(mismatches == 0);
      }
    }
  }
}

TEST_CASE("dropout with p = 0 is a copy", "[dropout]") {
  Generator gen(4);
  const Tensor x = randn({3, 5}, gen);
  const Tensor y = dropout(x, 0.0, 1, 0);
  REQUIRE(y.to_vector<double>() == x.to_vector<double>());
  REQUIRE(y.raw_data() != x.raw_data());
  REQUIRE(dropout_backward(x, 0.0, 1, 0).to_vector<double>() == x.to_vector<double>());
}

TEST_CASE("dropout rejects p outside [0, 1) and non-floating tensors", "[dropout]") {
  const Tensor x = ones({4});
  REQUIRE_THROWS_WITH(dropout(x, 1.0, 0, 0),
                      Catch::Contains("[dropout] expected p in [0, 1), found 1"));
  REQUIRE_THROWS_WITH(dropout(x, -0.1, 0, 0),
                      Catch::Contains("[dropout] expected p in [0, 1), found -0.1"));
  REQUIRE_THROWS_WITH(dropout_backward(x, NAN, 0, 0),
                      Catch::Contains("[dropout_backward] expected p in [0, 1), found nan"));
  REQUIRE_THROWS_WITH(
      dropout(ones({4}, {DType::i32}), 0.5, 0, 0),
      Catch::Contains("[dropout] expected x of dtype f32, f64, f16 or bf16, found i32"));
}

}  // namespace tessera
