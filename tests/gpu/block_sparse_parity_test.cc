// CPU vs CUDA parity of the block-sparse attention kernels (SDD, DSD with and without
// transpose_s, the block softmax with its masks, and its backward) in f32, bf16 and f16,
// and run-to-run determinism on the device. The CPU computes in f64 on the same (rounded)
// values; the backward's y is the reference's, rounded to the tested dtype.
#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "kernels/block_sparse.h"
#include "tests/gpu/parity.h"

namespace tessera {
namespace {

using kernels::BlockLayout;
using kernels::BlockSoftmaxOptions;
using kernels::MaskMode;
using testing::both;
using testing::check_bitwise;
using testing::check_close;
using testing::Input;
using testing::kCuda;
using testing::random;
using testing::tol_for;

const std::vector<DType> kHalfAndSingle = {DType::f32, DType::bf16, DType::f16};

constexpr int64_t kBatch = 2;
constexpr int64_t kHeads = 3;
constexpr int64_t kBlocks = 5;  // nb

// A layout (H, nb, nb) of about half the blocks, where head h has block row h + 1 and block
// column h + 2 empty (so DSD writes zeros and the transposed walk skips columns) and some
// rows hold only blocks above the diagonal (fully masked under causal).
Tensor test_layout() {
  std::vector<int32_t> bits(kHeads * kBlocks * kBlocks);
  for (int64_t h = 0; h < kHeads; ++h) {
    for (int64_t i = 0; i < kBlocks; ++i) {
      for (int64_t j = 0; j < kBlocks; ++j) {
        const bool on = (h * 7 + i * 3 + j * 5 + i * j) % 3 != 0;
        const bool empty = i == (h + 1) % kBlocks || j == (h + 2) % kBlocks;
        bits[(h * kBlocks + i) * kBlocks + j] = on && !empty ? 1 : 0;
      }
    }
  }
  return from_vector(bits, {kHeads, kBlocks, kBlocks});
}

// The layout's tables on the CPU (for the f64 reference) and on the device.
struct Layouts {
  BlockLayout ref;
  BlockLayout dev;
};

Layouts layouts(int64_t block) {
  const Tensor layout = test_layout();
  return {kernels::make_block_layout(layout, block, Device::cpu()),
          kernels::make_block_layout(layout, block, kCuda)};
}

// A 0/1 tensor of `shape` (mul-mode masks) from a fixed pattern, about one zero in four.
Tensor zero_one_mask(const Shape& shape, int64_t salt) {
  std::vector<float> values(static_cast<size_t>(numel_of(shape)));
  for (size_t k = 0; k < values.size(); ++k) values[k] = (k * 13 + salt) % 4 == 0 ? 0.f : 1.f;
  return from_vector(values, shape);
}

struct Geometry {
  int64_t block;
  int64_t dim;  // D
};
const Geometry kGeometries[] = {{16, 64}, {16, 24}, {32, 64}, {32, 24}};

TEST_CASE("block_sparse_sdd and block_sparse_dsd match the CPU", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  for (DType dt : kHalfAndSingle) {
    for (const Geometry& g : kGeometries) {
      DYNAMIC_SECTION(dtype_name(dt) << " block " << g.block << " D " << g.dim) {
        const Layouts l = layouts(g.block);
        REQUIRE(l.ref.nnz > 0);
        const int64_t T = kBlocks * g.block;
        const double tol = tol_for(dt, 1e-5);
        const Input a = random({kBatch, kHeads, T, g.dim}, 60, dt);  // (B, H, T, D)
        const Input b = random({kBatch, kHeads, T, g.dim}, 61, dt);  // (B, H, T, D)
        check_close(kernels::block_sparse_sdd(a.dev, b.dev, l.dev),
                    kernels::block_sparse_sdd(a.ref, b.ref, l.ref), dt, tol);

        const Input s = random({kBatch, l.ref.nnz, g.block, g.block}, 62, dt);  // (B, nnz, b, b)
        const Input x = random({kBatch, kHeads, T, g.dim}, 63, dt);             // (B, H, T, D)
        for (bool transpose_s : {false, true}) {
          INFO("transpose_s " << transpose_s);
          check_close(kernels::block_sparse_dsd(s.dev, x.dev, l.dev, transpose_s),
                      kernels::block_sparse_dsd(s.ref, x.ref, l.ref, transpose_s), dt, tol);
        }
      }
    }
  }
}

TEST_CASE("block_sparse_softmax and its backward match the CPU under every mask", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  struct Case {
    const char* name;
    bool causal;
    bool key_padding;
    MaskMode key_padding_mode;
    bool attn;
    MaskMode attn_mode;
  };
  const Case cases[] = {
      {"no mask", false, false, MaskMode::add, false, MaskMode::mul},
      {"causal", true, false, MaskMode::add, false, MaskMode::mul},
      {"key padding add, attn mask mul", false, true, MaskMode::add, true, MaskMode::mul},
      {"key padding mul, attn mask add, causal", true, true, MaskMode::mul, true, MaskMode::add},
  };
  for (DType dt : kHalfAndSingle) {
    for (const Geometry& g : {kGeometries[0], kGeometries[2]}) {
      DYNAMIC_SECTION(dtype_name(dt) << " block " << g.block) {
        const Layouts l = layouts(g.block);
        const int64_t T = kBlocks * g.block;
        const Shape shape = {kBatch, l.ref.nnz, g.block, g.block};
        const double tol = tol_for(dt, 1e-5);
        const Input x = random(shape, 70, dt, -4.0, 4.0);  // (B, nnz, b, b)
        const Input dy = random(shape, 71, dt);            // (B, nnz, b, b)
        for (const Case& c : cases) {
          INFO(c.name);
          BlockSoftmaxOptions ref, dev;
          ref.scale = dev.scale = 0.375;
          ref.causal = dev.causal = c.causal;
          if (c.key_padding) {
            const Input m = c.key_padding_mode == MaskMode::mul
                                ? both(zero_one_mask({kBatch, T}, 1), dt)
                                : random({kBatch, T}, 72, dt, -2.0, 0.0);  // (B, T)
            ref.key_padding_mask = m.ref;
            dev.key_padding_mask = m.dev;
            ref.key_padding_mode = dev.key_padding_mode = c.key_padding_mode;
          }
          if (c.attn) {
            const Input m = c.attn_mode == MaskMode::mul ? both(zero_one_mask({T, T}, 2), dt)
                                                         : random({T, T}, 73, dt, -2.0, 2.0);
            ref.attn_mask = m.ref;  // (T, T)
            dev.attn_mask = m.dev;
            ref.attn_mask_mode = dev.attn_mask_mode = c.attn_mode;
          }
          const Tensor want = kernels::block_sparse_softmax(x.ref, l.ref, ref);
          check_close(kernels::block_sparse_softmax(x.dev, l.dev, dev), want, dt, tol);

          const Input y = both(want, dt);
          check_close(kernels::block_sparse_softmax_backward(y.dev, dy.dev, l.dev, 0.375),
                      kernels::block_sparse_softmax_backward(y.ref, dy.ref, l.ref, 0.375), dt, tol);
        }
      }
    }
  }
}

TEST_CASE("block-sparse kernels give bitwise equal results run to run", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const Layouts l = layouts(32);
  const int64_t T = kBlocks * 32;
  const DType dt = DType::f32;
  const Input a = random({kBatch, kHeads, T, 24}, 80, dt);       // (B, H, T, D)
  const Input b = random({kBatch, kHeads, T, 24}, 81, dt);       // (B, H, T, D)
  const Input s = random({kBatch, l.ref.nnz, 32, 32}, 82, dt);   // (B, nnz, b, b)
  const Input dy = random({kBatch, l.ref.nnz, 32, 32}, 83, dt);  // (B, nnz, b, b)
  check_bitwise(kernels::block_sparse_sdd(a.dev, b.dev, l.dev),
                kernels::block_sparse_sdd(a.dev, b.dev, l.dev));
  for (bool transpose_s : {false, true}) {
    check_bitwise(kernels::block_sparse_dsd(s.dev, a.dev, l.dev, transpose_s),
                  kernels::block_sparse_dsd(s.dev, a.dev, l.dev, transpose_s));
  }
  BlockSoftmaxOptions options;
  options.causal = true;
  const Tensor y = kernels::block_sparse_softmax(s.dev, l.dev, options);
  check_bitwise(y, kernels::block_sparse_softmax(s.dev, l.dev, options));
  check_bitwise(kernels::block_sparse_softmax_backward(y, dy.dev, l.dev, 0.5),
                kernels::block_sparse_softmax_backward(y, dy.dev, l.dev, 0.5));
}

}  // namespace
}  // namespace tessera
