#include "kernels/cpu/dropout.h"

#include <algorithm>
#include <cstdint>

#include "core/dispatch.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "core/philox.h"
#include "kernels/cpu/widen.h"

namespace tessera::kernels::cpu {
namespace {

// Note [Philox in lanes]
// core's philox4x32 makes one block per call; at one call per 4 elements dropout spent
// about 10 ns per element. philox_lanes runs the same ten rounds on kLanes consecutive
// counters stored lane by lane, which the compiler turns into SIMD multiplies; 64 lanes
// give enough independent work to hide the multiply latency (about 1.5 ns per element on
// the dev box, one thread). dropout_test checks the mask bit for bit against philox4x32.
// The lanes' counters need not be consecutive: dropout_keep_rows fills them with the blocks
// of several short rows.
constexpr int64_t kLanes = 64;

struct PhiloxLanes {
  uint32_t word[4][kLanes];  // word j of lane l's block is word[j][l]
};

// Lane l's counter := counters[l] (high counter word 0), for l < n; the other lanes' are 0.
void set_counters(const uint64_t* counters, int64_t n, PhiloxLanes& lanes) {
  for (int64_t l = 0; l < kLanes; ++l) {
    const uint64_t counter = l < n ? counters[l] : 0;
    lanes.word[0][l] = static_cast<uint32_t>(counter);
    lanes.word[1][l] = static_cast<uint32_t>(counter >> 32);
    lanes.word[2][l] = 0;
    lanes.word[3][l] = 0;
  }
}

// Turns every lane's counter into its Philox4x32-10 block under `key`, in place, as
// core/philox.cc does one block.
void philox_rounds(uint64_t key, PhiloxLanes& lanes) {
  constexpr uint32_t kMul0 = 0xD2511F53u;
  constexpr uint32_t kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u;
  constexpr uint32_t kWeyl1 = 0xBB67AE85u;
  uint32_t(&c0)[kLanes] = lanes.word[0];
  uint32_t(&c1)[kLanes] = lanes.word[1];
  uint32_t(&c2)[kLanes] = lanes.word[2];
  uint32_t(&c3)[kLanes] = lanes.word[3];
  uint32_t k0 = static_cast<uint32_t>(key);
  uint32_t k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
#pragma omp simd
    for (int64_t l = 0; l < kLanes; ++l) {
      const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0[l];
      const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2[l];
      c0[l] = static_cast<uint32_t>(p1 >> 32) ^ c1[l] ^ k0;
      c2[l] = static_cast<uint32_t>(p0 >> 32) ^ c3[l] ^ k1;
      c1[l] = static_cast<uint32_t>(p1);
      c3[l] = static_cast<uint32_t>(p0);
    }
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
}

// Philox blocks for counters first_counter .. first_counter + kLanes - 1 under `key`.
void philox_lanes(uint64_t first_counter, uint64_t key, PhiloxLanes& out) {
  uint64_t counters[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) counters[l] = first_counter + static_cast<uint64_t>(l);
  set_counters(counters, kLanes, out);
  philox_rounds(key, out);
}

// y[e] = x[e] * scale where bits[e] maps to a uniform >= threshold, else 0.
template <class T>
void mask_group(const T* x, T* y, const uint32_t* bits, int64_t len, float threshold, T scale) {
#pragma omp simd
  for (int64_t e = 0; e < len; ++e) {
    y[e] = uniform_from_bits(bits[e]) >= threshold ? x[e] * scale : T(0);
  }
}

// y[i] = keep(i) ? x[i] / (1 - p) : 0 over the row-major elements of x, where element i
// uses word i % 4 of Philox block offset + i / 4. The threshold is compared in float, as
// the CUDA kernel does, so both keep the same elements for every p.
Tensor apply_mask(const char* op, const Tensor& x_in, double p, uint64_t seed,
                  uint64_t offset) {  // (*) -> (*)
  const Tensor x = x_in.detach().contiguous();
  Tensor y = empty(x.shape(), {x.dtype(), x.device()});
  const int64_t n = x.numel();
  const float threshold = static_cast<float>(p);
  constexpr int64_t kGroup = 4 * kLanes;  // elements per philox_lanes call
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data_ptr<T>();
    T* py = y.data_ptr<T>();
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    parallel_for((n + kGroup - 1) / kGroup, 256, [&](int64_t g0, int64_t g1) {
      PhiloxLanes lanes;
      uint32_t bits[kGroup];  // in element order
      for (int64_t g = g0; g < g1; ++g) {
        philox_lanes(offset + static_cast<uint64_t>(g * kLanes), seed, lanes);
#pragma omp simd
        for (int64_t l = 0; l < kLanes; ++l) {
          for (int64_t j = 0; j < 4; ++j) bits[4 * l + j] = lanes.word[j][l];
        }
        const int64_t i0 = g * kGroup;
        mask_group(px + i0, py + i0, bits, std::min(kGroup, n - i0), threshold, scale);
      }
    });
  });
  return y;
}

}  // namespace

void dropout_keep_rows(uint64_t seed, uint64_t offset, uint64_t first, uint64_t row_stride,
                       int64_t rows, int64_t cols, double p, uint8_t* keep, int64_t ld) {
  if (rows <= 0 || cols <= 0) return;
  const float threshold = static_cast<float>(p);
  // The blocks the rows' elements use, kLanes at a time (Note [Philox in lanes]): a row of
  // 64 elements takes 16 or 17, so one call fills the lanes with several rows' blocks.
  PhiloxLanes lanes;
  uint64_t counters[kLanes], blocks[kLanes];
  int64_t row_of[kLanes];
  int64_t n = 0;
  const auto flush = [&] {
    set_counters(counters, n, lanes);
    philox_rounds(seed, lanes);
    for (int64_t l = 0; l < n; ++l) {
      const uint64_t row_first = first + static_cast<uint64_t>(row_of[l]) * row_stride;
      uint8_t* row_keep = keep + row_of[l] * ld;
      for (int j = 0; j < 4; ++j) {
        const uint64_t e = 4 * blocks[l] + static_cast<uint64_t>(j);
        if (e < row_first || e >= row_first + static_cast<uint64_t>(cols)) continue;
        row_keep[e - row_first] = uniform_from_bits(lanes.word[j][l]) >= threshold ? 1 : 0;
      }
    }
    n = 0;
  };
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t row_first = first + static_cast<uint64_t>(r) * row_stride;
    const uint64_t last = (row_first + static_cast<uint64_t>(cols) - 1) / 4;
    for (uint64_t b = row_first / 4; b <= last; ++b) {
      if (n == kLanes) flush();
      counters[n] = offset + b;
      blocks[n] = b;
      row_of[n] = r;
      ++n;
    }
  }
  flush();
}

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset) {
  if (is_half(x.dtype())) return narrowed(cpu::dropout(widened(x), p, seed, offset), x.dtype());
  return apply_mask("dropout", x, p, seed, offset);
}

Tensor dropout_backward(const Tensor& dy, double p, uint64_t seed, uint64_t offset) {
  if (is_half(dy.dtype())) {
    return narrowed(cpu::dropout_backward(widened(dy), p, seed, offset), dy.dtype());
  }
  return apply_mask("dropout_backward", dy, p, seed, offset);
}

}  // namespace tessera::kernels::cpu
