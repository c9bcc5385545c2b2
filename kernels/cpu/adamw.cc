#include "kernels/cpu/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/allocator.h"
#include "core/dispatch.h"
#include "core/half_convert.h"
#include "core/parallel.h"
#include "kernels/cpu/eigen_types.h"
#include "kernels/cpu/widen.h"

namespace tessera::kernels::cpu {
namespace {

// Note [AdamW in cache-sized blocks]
// Each Eigen statement below is one fused loop; running them over blocks that fit in L1
// keeps the seven streams (read p, g, m, v; write p, m, v) at one pass over memory. Blocks
// start at multiples of kBlock in their tensor and the threads split whole blocks, so which
// elements take Eigen's vector path (and so the rounding) does not depend on the thread
// count. Nor on where the tensors lie: Eigen computes the elements before its destination's
// first packet boundary (64 bytes with AVX-512, 32 with AVX2) on its scalar path, so a
// block whose parameter or moments are not 64-byte aligned is staged through buffers that
// are (Note [Aligned scratch] in widen.h); the
// gradient is only read, in place. ZeRO's master chunks are views at any offset of a flat
// shard, or storages of their own, and the same values must step to the same bits in both.
// A multi-tensor step lays the blocks of all its tensors end to end: one parallel region for
// the whole list, and a thread's range may span several tensors.
constexpr int64_t kBlock = 1024;
constexpr int64_t kGrainBlocks = 64;  // blocks per thread, at least

// The hyperparameters in the element type, bias corrections folded into reciprocals.
template <class T>
struct Coefficients {
  T lr, beta1, beta2, eps, wd, inv_bc1, inv_bc2;
  bool l2;  // L2 mode (decay folded into the gradient) rather than AdamW's decoupled decay

  explicit Coefficients(const AdamWParams& p) {
    const double bc1 = p.bias_correction ? 1 - std::pow(p.beta1, static_cast<double>(p.step)) : 1;
    const double bc2 = p.bias_correction ? 1 - std::pow(p.beta2, static_cast<double>(p.step)) : 1;
    lr = static_cast<T>(p.lr);
    beta1 = static_cast<T>(p.beta1);
    beta2 = static_cast<T>(p.beta2);
    eps = static_cast<T>(p.eps);
    wd = static_cast<T>(p.weight_decay);
    inv_bc1 = static_cast<T>(1 / bc1);
    inv_bc2 = static_cast<T>(1 / bc2);
    l2 = !p.adam_w_mode;
  }
};

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kCpuAlignment == 0; }

// One block of `len` elements, in place.
template <class T>
void update_block(T* pp, const T* pg, T* pm, T* pv, int64_t len, const Coefficients<T>& c) {
  ArrayMap<T> w(pp, len);
  ArrayMap<T> m(pm, len);
  ArrayMap<T> v(pv, len);
  const ConstArrayMap<T> g(pg, len);
  if (c.l2) {
    // L2 mode folds the decay into the gradient.
    const auto g_l2 = g + c.wd * w;
    m = c.beta1 * m + (1 - c.beta1) * g_l2;
    v = c.beta2 * v + (1 - c.beta2) * g_l2.square();
    w -= c.lr * ((m * c.inv_bc1) / ((v * c.inv_bc2).sqrt() + c.eps));
  } else {
    // AdamW mode decays the parameter in the update, decoupled from the moments.
    m = c.beta1 * m + (1 - c.beta1) * g;
    v = c.beta2 * v + (1 - c.beta2) * g.square();
    w -= c.lr * ((m * c.inv_bc1) / ((v * c.inv_bc2).sqrt() + c.eps) + c.wd * w);
  }
}

// The updated parameters [0, len) rounded into the model copy's elements at `offset`.
template <class T>
void round_copy(const T* w, const Tensor& copy, int64_t offset, int64_t len) {
  if constexpr (std::is_same_v<T, float>) {
    if (copy.dtype() == DType::bf16) {
      f32_to_bf16(w, copy.data_ptr<BFloat16>() + offset, len);
    } else {
      f32_to_f16(w, copy.data_ptr<Half>() + offset, len);
    }
  }
}

// Elements [begin, end) of one parameter's tensors; each gradient multiplied by `scale`
// first unless it is 1 (scale_'s product: Note [Scaled AdamW] in
// kernels/cuda/optimizers.cu).
template <class T>
void update(const AdamWTensors& t, int64_t begin, int64_t end, const Coefficients<T>& c, T scale) {
  T* pp = t.param.data_ptr<T>();
  const T* pg = t.grad.data_ptr<T>();
  T* pm = t.exp_avg.data_ptr<T>();
  T* pv = t.exp_avg_sq.data_ptr<T>();
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t len = std::min(kBlock, end - b);
    const T* g = pg + b;
    alignas(kCpuAlignment) T scaled[kBlock];
    if (scale != T(1)) {
      ArrayMap<T>(scaled, len) = ConstArrayMap<T>(g, len) * scale;
      g = scaled;
    }
    // Eigen peels to the destination's alignment; the gradient is only read.
    if (aligned(pp + b) && aligned(pm + b) && aligned(pv + b)) {
      update_block<T>(pp + b, g, pm + b, pv + b, len, c);
    } else {
      alignas(kCpuAlignment) T w[kBlock], m[kBlock], v[kBlock];
      const auto n = static_cast<size_t>(len);
      std::copy_n(pp + b, n, w);
      std::copy_n(pm + b, n, m);
      std::copy_n(pv + b, n, v);
      update_block<T>(w, g, m, v, len, c);
      std::copy_n(w, n, pp + b);
      std::copy_n(m, n, pm + b);
      std::copy_n(v, n, pv + b);
    }
    if (t.model_copy.defined()) round_copy<T>(pp + b, t.model_copy, b, len);
  }
}

}  // namespace

void adamw_step(const std::vector<AdamWTensors>& tensors, const AdamWParams& p,
                const Tensor& grad_scale) {
  if (tensors.empty()) return;
  double scale = 1.0;
  if (grad_scale.defined()) {
    scale = grad_scale.data_ptr<double>()[0];
    if (!std::isfinite(scale)) return;  // a skipped step: nothing changes
  }
  if (is_half(tensors.front().param.dtype())) {  // (no grad_scale, no model copies)
    std::vector<AdamWTensors> wide;
    for (const AdamWTensors& t : tensors) {
      wide.push_back(
          {widened(t.param), widened(t.grad), widened(t.exp_avg), widened(t.exp_avg_sq), Tensor()});
    }
    cpu::adamw_step(wide, p, Tensor());
    for (size_t i = 0; i < tensors.size(); ++i) {
      tensors[i].param.copy_(wide[i].param);
      tensors[i].exp_avg.copy_(wide[i].exp_avg);
      tensors[i].exp_avg_sq.copy_(wide[i].exp_avg_sq);
    }
    return;
  }
  // first[i]: index of tensor i's first block in the end-to-end order; first.back(): total.
  std::vector<int64_t> first(tensors.size() + 1, 0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    first[i + 1] = first[i] + (tensors[i].param.numel() + kBlock - 1) / kBlock;
  }
  dispatch_floating(tensors.front().param.dtype(), "adamw_step", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Coefficients<T> c(p);
    parallel_for(first.back(), kGrainBlocks, [&](int64_t b0, int64_t b1) {
      // The last tensor whose blocks start at or before b0, then each one overlapping [b0, b1).
      auto i =
          static_cast<size_t>(std::upper_bound(first.begin(), first.end(), b0) - first.begin() - 1);
      for (; i < tensors.size() && first[i] < b1; ++i) {
        const int64_t begin = (std::max(b0, first[i]) - first[i]) * kBlock;
        const int64_t end = (std::min(b1, first[i + 1]) - first[i]) * kBlock;
        update<T>(tensors[i], begin, std::min(end, tensors[i].param.numel()), c,
                  static_cast<T>(scale));
      }
    });
  });
}

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWParams& p) {
  cpu::adamw_step(std::vector<AdamWTensors>{{param, grad, exp_avg, exp_avg_sq, Tensor()}}, p,
                  Tensor());
}

}  // namespace tessera::kernels::cpu
