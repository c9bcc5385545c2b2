#include "kernels/cpu/softmax.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dispatch.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "kernels/checks.h"
#include "kernels/cpu/avx512_math.h"
#include "kernels/cpu/eigen_types.h"
#include "kernels/cpu/widen.h"

namespace tessera::kernels::cpu {
namespace {

// Rows per parallel_for chunk, so that each chunk touches at least ~32K elements.
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(cols, 1)); }

// Calls fn(a_row, b_row, out_row) on every last-dim row, rows split across threads, and
// returns the new contiguous output. a and b are (..., V) of one dtype; an undefined b
// passes a's row in its place.
template <class Fn>
Tensor map_rows(const char* op, const Tensor& a_in, const Tensor& b_in, Fn&& fn) {
  const Tensor a = a_in.detach().contiguous();
  const Tensor b = contiguous_or_undefined(b_in);
  Tensor out = empty(a.shape(), {a.dtype(), a.device()});
  if (out.numel() == 0) return out;
  const int64_t cols = a.size(-1);
  const int64_t rows = a.numel() / cols;
  dispatch_floating(a.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = a.data_ptr<T>();
    const T* pb = b.defined() ? b.data_ptr<T>() : nullptr;
    T* po = out.data_ptr<T>();
    parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t at = r * cols;
        fn(ConstArrayMap<T>(pa + at, cols), ConstArrayMap<T>(pb == nullptr ? pa : pb + at, cols),
           ArrayMap<T>(po + at, cols));
      }
    });
  });
  return out;
}

#if defined(__AVX512F__)
// The lanewise max of x[0, n) folded into `acc` (masked-off lanes read as -inf).
inline __m512 max_into(__m512 acc, const float* x, int64_t i, __mmask16 m) {
  return _mm512_max_ps(acc, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, x + i));
}

// softmax over the last dim of an f32 tensor with AVX-512 (Note [Memory-bound kernels] in
// kernels/cpu/avx512_math.h), in one loop per row r that reads row r + 1 from memory for
// its max, computes e^(x - max) of row r into a row of scratch (L1/L2) and its sum, and
// writes row r - 1's output from the other scratch row times 1 / its sum. Reads, writes
// and the exp all overlap: written in passes of their own, the output's stores came in
// bursts of a whole row, waiting on memory while the core idled, and the kernel ran at
// 0.55-0.7 of memcpy.
Tensor softmax_f32_avx512(const Tensor& x_in) {
  const Tensor x = x_in.detach().contiguous();  // (..., V)
  Tensor out = empty(x.shape(), {x.dtype(), x.device()});
  if (out.numel() == 0) return out;
  const int64_t cols = x.size(-1);
  const int64_t rows = x.numel() / cols;
  const float* px = x.data_ptr<float>();
  float* po = out.data_ptr<float>();
  parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    std::vector<float> scratch(static_cast<size_t>(2 * cols));  // (2, V): e^(x - max) of two rows
    __m512 vmax = _mm512_set1_ps(-INFINITY);                    // of row r
    for (int64_t i = 0; i < cols; i += 16) {
      vmax = max_into(vmax, px + r0 * cols, i, first_lanes(cols - i));
    }
    float prev_inv_sum = 0;  // 1 / sum of row r - 1
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = px + r * cols;
      const float* next = r + 1 < r1 ? xr + cols : nullptr;
      float* e = scratch.data() + (r % 2) * cols;
      const float* prev_e = scratch.data() + ((r + 1) % 2) * cols;
      float* prev_out = r > r0 ? po + (r - 1) * cols : nullptr;
      const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
      const __m512 prev_inv = _mm512_set1_ps(prev_inv_sum);
      vmax = _mm512_set1_ps(-INFINITY);
      __m512 vsum = _mm512_setzero_ps();
      for (int64_t i = 0; i < cols; i += 16) {
        const __mmask16 m = first_lanes(cols - i);
        if (next != nullptr) {
          _mm_prefetch(reinterpret_cast<const char*>(next + i + kPrefetchFloats), _MM_HINT_T0);
          vmax = max_into(vmax, next, i, m);
        }
        const __m512 ei = exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, xr + i), max));
        _mm512_mask_storeu_ps(e + i, m, ei);
        vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(m, ei));
        if (prev_out != nullptr) {
          _mm_prefetch(reinterpret_cast<const char*>(prev_out + i + kPrefetchFloats), _MM_HINT_ET0);
          _mm512_mask_storeu_ps(prev_out + i, m,
                                _mm512_mul_ps(_mm512_maskz_loadu_ps(m, prev_e + i), prev_inv));
        }
      }
      prev_inv_sum = 1 / _mm512_reduce_add_ps(vsum);
    }
    const float* last_e = scratch.data() + ((r1 - 1) % 2) * cols;
    const __m512 last_inv = _mm512_set1_ps(prev_inv_sum);
    for_each_vector(po + (r1 - 1) * cols, cols, [&](int64_t i, __mmask16 m) {
      return _mm512_mul_ps(_mm512_maskz_loadu_ps(m, last_e + i), last_inv);
    });
  });
  return out;
}
#endif

}  // namespace

Tensor softmax(const Tensor& x) {
  if (is_half(x.dtype())) return narrowed(cpu::softmax(widened(x)), x.dtype());
#if defined(__AVX512F__)
  if (x.dtype() == DType::f32) return softmax_f32_avx512(x);
#endif
  return map_rows("softmax", x, Tensor(), [](auto xr, auto, auto yr) {
    using T = typename decltype(yr)::Scalar;
    const T max = xr.maxCoeff();
    // exp and sum block by block, so the sum reads values still in L1.
    constexpr int64_t kBlock = 1024;
    T sum = 0;
    for (int64_t j = 0; j < xr.size(); j += kBlock) {
      const int64_t len = std::min<int64_t>(kBlock, xr.size() - j);
      auto yb = yr.segment(j, len);
      yb = (xr.segment(j, len) - max).exp();
      sum += yb.sum();
    }
    yr *= 1 / sum;
  });
}

Tensor log_softmax(const Tensor& x) {
  if (is_half(x.dtype())) return narrowed(cpu::log_softmax(widened(x)), x.dtype());
  return map_rows("log_softmax", x, Tensor(), [](auto xr, auto, auto yr) {
    const auto max = xr.maxCoeff();
    yr = (xr - max).exp();
    yr = xr - (max + std::log(yr.sum()));
  });
}

Tensor softmax_backward(const Tensor& dy, const Tensor& y) {
  if (is_half(y.dtype())) {
    return narrowed(cpu::softmax_backward(widened(dy), widened(y)), y.dtype());
  }
  return map_rows("softmax_backward", dy, y,
                  [](auto dyr, auto yr, auto dxr) { dxr = yr * (dyr - (dyr * yr).sum()); });
}

Tensor log_softmax_backward(const Tensor& dy, const Tensor& y) {
  if (is_half(y.dtype())) {
    return narrowed(cpu::log_softmax_backward(widened(dy), widened(y)), y.dtype());
  }
  return map_rows("log_softmax_backward", dy, y,
                  [](auto dyr, auto yr, auto dxr) { dxr = dyr - yr.exp() * dyr.sum(); });
}

}  // namespace tessera::kernels::cpu
