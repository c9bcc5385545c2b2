// CUDA optimizer steps: fused AdamW, LAMB (deterministic device norms) and SGD, with the
// math of kernels/cpu/{adamw,lamb,sgd}.cc in the accumulation type.
//
// Note [LAMB on the device]
// As on the CPU (Note [LAMB in two passes]), pass 1 updates the moments and sums |p|^2 and
// |u|^2; pass 2 recomputes u from the new moments and the untouched p. Between them one
// block adds the per-block partials in a fixed order (the first pass's grid depends only
// on n) and computes the trust ratio on the device, so pass 2 is queued without waiting
// for the host; only that one scalar is copied back, after pass 2.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/factories.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels::cuda {
namespace {

constexpr int kMaxReduceBlocks = 1024;

// True when every pointer allows VEC-element vector accesses.
template <class T, int VEC, class... P>
bool all_aligned(const P*... p) {
  return (aligned_for<T, VEC>(p) && ...);
}

__device__ __forceinline__ float m_sqrt(float v) { return sqrtf(v); }
__device__ __forceinline__ double m_sqrt(double v) { return sqrt(v); }

// Loads pack k (or element k when VEC == 1) of p.
template <int VEC, class T>
__device__ __forceinline__ Pack<T, VEC> load(const T* p, int64_t k) {
  return reinterpret_cast<const Pack<T, VEC>*>(p)[k];
}
template <int VEC, class T>
__device__ __forceinline__ void store(T* p, int64_t k, const Pack<T, VEC>& v) {
  reinterpret_cast<Pack<T, VEC>*>(p)[k] = v;
}

// This thread's share of n elements, grid-stride: body(width, k) for pack k of VEC
// elements, then for the tail element by element as packs of one (width is an
// integral_constant, so the body loads Pack<T, width> and indexes in packs of it).
template <int VEC, class F>
__device__ __forceinline__ void for_each_pack(int64_t n, const F& body) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = n / VEC;
  for (int64_t k = first; k < packs; k += stride) body(std::integral_constant<int, VEC>{}, k);
  if constexpr (VEC > 1) {
    for (int64_t i = packs * VEC + first; i < n; i += stride) {
      body(std::integral_constant<int, 1>{}, i);
    }
  }
}

// ---- AdamW -------------------------------------------------------------------------------

template <class A>
struct AdamWConsts {
  A lr, beta1, beta2, eps, wd, inv_bc1, inv_bc2;
  bool l2;                   // !adam_w_mode: the decay is folded into the gradient
  const double* grad_scale;  // null, or the gradients' multiplier (Note [Scaled AdamW])
};

// Note [Scaled AdamW]
// With a grad_scale (kernels/adamw.h) every block reads the multiplier from device memory:
// a value that is not finite (an f16 overflow's clip factor) makes the block return before
// it writes anything, so a skipped step needs no host decision; otherwise each gradient is
// multiplied by it as scale_kernel (kernels/cuda/blas1.cu) would, in the accumulation type
// and rounded to T, and the update goes on as without. With a model copy (C not NoCopy)
// the updated f32 parameter is also rounded into its 16-bit tensor, as the contiguous
// dtype conversion rounds (core/cuda/copy_kernel.cu). So the step equals scale_, adamw_step
// and copy_ in turn, bit for bit, in one pass over memory.
struct NoCopy {};

// The gradient multiplier of a scaled step: 1 without one; false when the step is skipped.
template <class A>
__device__ __forceinline__ bool step_scale(const double* grad_scale, A* scale) {
  *scale = A(1);
  if (grad_scale == nullptr) return true;
  const double s = *grad_scale;
  if (!(s - s == 0.0)) return false;  // inf or NaN
  *scale = static_cast<A>(s);
  return true;
}

// One element, in the CPU's order of operations (kernels/cpu/adamw.cc).
template <class T>
__device__ __forceinline__ void adamw_element(T& w_io, T g_in, T& m_io, T& v_io,
                                              const AdamWConsts<acc_t<T>>& c, acc_t<T> scale) {
  using A = acc_t<T>;
  A w = to_acc(w_io);
  A g = to_acc(from_acc<T>(to_acc(g_in) * scale));
  if (c.l2) g = g + c.wd * w;
  const A m = c.beta1 * to_acc(m_io) + (A(1) - c.beta1) * g;
  const A v = c.beta2 * to_acc(v_io) + (A(1) - c.beta2) * (g * g);
  A update = (m * c.inv_bc1) / (m_sqrt(v * c.inv_bc2) + c.eps);
  if (!c.l2) update = update + c.wd * w;
  w = w - c.lr * update;
  w_io = from_acc<T>(w);
  m_io = from_acc<T>(m);
  v_io = from_acc<T>(v);
}

// Pack k of W elements (W = 1: element k) of the four tensors, stepped in place, and the
// updated parameters rounded into `copy` unless C is NoCopy.
template <int W, class T, class C>
__device__ __forceinline__ void adamw_pack(T* w, const T* g, T* m, T* v, C* copy, int64_t k,
                                           const AdamWConsts<acc_t<T>>& c, acc_t<T> scale) {
  Pack<T, W> pw = load<W>(w, k), pm = load<W>(m, k), pv = load<W>(v, k);
  const Pack<T, W> pg = load<W>(g, k);
#pragma unroll
  for (int e = 0; e < W; ++e) adamw_element(pw.v[e], pg.v[e], pm.v[e], pv.v[e], c, scale);
  store<W>(w, k, pw);
  store<W>(m, k, pm);
  store<W>(v, k, pv);
  if constexpr (!std::is_same_v<C, NoCopy>) {
    Pack<C, W> pc;
#pragma unroll
    for (int e = 0; e < W; ++e) pc.v[e] = from_acc<C>(to_acc(pw.v[e]));
    store<W>(copy, k, pc);
  }
}

template <int VEC, class T, class C>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(T* __restrict__ w, const T* __restrict__ g, T* __restrict__ m, T* __restrict__ v,
                 C* __restrict__ copy, int64_t n, AdamWConsts<acc_t<T>> c) {
  acc_t<T> scale;
  if (!step_scale(c.grad_scale, &scale)) return;
  for_each_pack<VEC>(n, [&](auto width, int64_t k) {
    adamw_pack<decltype(width)::value>(w, g, m, v, copy, k, c, scale);
  });
}

// Note [Multi-tensor AdamW]
// A GPT has a few hundred parameters, most of them small: one launch each costs more in
// launch latency than the math. The multi-tensor kernel takes a table of up to
// kMultiTensors tensors and kMultiBlocks (tensor, chunk) pairs in its arguments (about 20
// KB: kernel arguments may take 32 KB since CUDA 12.1 on compute capability 7.0 and up);
// block b updates chunk block_chunk[b] of tensor block_tensor[b], kMultiChunk elements.
// The host fills tables in tensor order and launches whenever one is full, so a list of
// any length takes ceil(total chunks / kMultiBlocks) launches or a few more: GPT-2 124M's
// 148 tensors in about 2000 chunks take one launch (with 4 KB tables, 24 tensors and 320
// blocks, it took 7 launches of at most 320 blocks, under 3 per SM of an H100). A driver
// older than CUDA 12.1 cannot take such arguments: there each tensor gets the one-tensor
// kernel.
// Each element goes through adamw_element, so the numbers equal the one-tensor kernel's
// bit for bit.
constexpr int kMultiTensors = 192;
constexpr int kMultiBlocks = 2560;
constexpr int64_t kMultiChunk = 65536;  // elements per block: a multiple of every VEC

template <class T, class C>
struct MultiTensorTable {
  T* w[kMultiTensors];
  const T* g[kMultiTensors];
  T* m[kMultiTensors];
  T* v[kMultiTensors];
  C* copy[kMultiTensors];  // unused with NoCopy
  int64_t n[kMultiTensors];
  uint8_t block_tensor[kMultiBlocks];
  int32_t block_chunk[kMultiBlocks];
};
static_assert(sizeof(MultiTensorTable<double, NoCopy>) + sizeof(AdamWConsts<double>) < 32000,
              "the table must fit the 32 KB kernel-argument limit");
static_assert(kMultiTensors <= 256, "block_tensor holds a slot in a uint8_t");
static_assert(CUDART_VERSION >= 12010, "kernel arguments over 4 KB need CUDA 12.1");

template <class T, class C>
__global__ void __launch_bounds__(kThreads)
    adamw_multi_kernel(MultiTensorTable<T, C> table, AdamWConsts<acc_t<T>> c) {
  constexpr int kVec = vec_of<T>();
  acc_t<T> scale;
  if (!step_scale(c.grad_scale, &scale)) return;
  const int t = table.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(table.block_chunk[blockIdx.x]) * kMultiChunk;
  const int64_t rest = table.n[t] - begin;
  const int64_t count = rest < kMultiChunk ? rest : kMultiChunk;
  T* w = table.w[t] + begin;
  const T* g = table.g[t] + begin;
  T* m = table.m[t] + begin;
  T* v = table.v[t] + begin;
  C* copy = nullptr;
  if constexpr (!std::is_same_v<C, NoCopy>) copy = table.copy[t] + begin;
  // kMultiChunk is a multiple of kVec: a chunk is aligned when its tensor is.
  bool aligned = ((reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(g) |
                   reinterpret_cast<uintptr_t>(m) | reinterpret_cast<uintptr_t>(v)) %
                  (sizeof(T) * kVec)) == 0;
  if constexpr (!std::is_same_v<C, NoCopy>) {
    aligned = aligned && reinterpret_cast<uintptr_t>(copy) % (sizeof(C) * kVec) == 0;
  }
  const int64_t packs = aligned ? count / kVec : 0;
  for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
    adamw_pack<kVec>(w, g, m, v, copy, k, c, scale);
  }
  for (int64_t i = packs * kVec + threadIdx.x; i < count; i += blockDim.x) {
    adamw_pack<1>(w, g, m, v, copy, i, c, scale);
  }
}

// ---- LAMB --------------------------------------------------------------------------------

template <class A>
struct LambConsts {
  A beta1, beta2, eps, wd, inv_bc1, inv_bc2;
  bool eps_inside_sqrt;
};

// u = m_hat / (sqrt(v_hat) + eps) + wd p from the updated moments (kernels/cpu/lamb.cc).
template <class A>
__device__ __forceinline__ A lamb_update(A m, A v, A w, const LambConsts<A>& c) {
  const A denom = c.eps_inside_sqrt ? m_sqrt(v * c.inv_bc2 + c.eps) : m_sqrt(v * c.inv_bc2) + c.eps;
  return (m * c.inv_bc1) / denom + c.wd * w;
}

// Pass 1 for one element: updates the moments, adds p^2 and u^2 to the sums.
template <class T>
__device__ __forceinline__ void lamb_moments_element(T w_in, T g_in, T& m_io, T& v_io,
                                                     const LambConsts<acc_t<T>>& c, double& p_sq,
                                                     double& u_sq) {
  using A = acc_t<T>;
  const A w = to_acc(w_in);
  const A g = to_acc(g_in);
  const A m = c.beta1 * to_acc(m_io) + (A(1) - c.beta1) * g;
  const A v = c.beta2 * to_acc(v_io) + (A(1) - c.beta2) * (g * g);
  m_io = from_acc<T>(m);
  v_io = from_acc<T>(v);
  // u from the stored (rounded) moments, as pass 2 will see them.
  const double u = static_cast<double>(lamb_update(to_acc(m_io), to_acc(v_io), w, c));
  p_sq += static_cast<double>(w) * static_cast<double>(w);
  u_sq += u * u;
}

// partials[blockIdx.x] = this block's sum of p^2, partials[gridDim.x + blockIdx.x] of u^2.
template <int VEC, class T>
__global__ void __launch_bounds__(kThreads)
    lamb_moments_kernel(const T* __restrict__ w, const T* __restrict__ g, T* __restrict__ m,
                        T* __restrict__ v, int64_t n, LambConsts<acc_t<T>> c,
                        double* __restrict__ partials) {
  __shared__ double scratch[32];
  double p_sq = 0, u_sq = 0;
  for_each_pack<VEC>(n, [&](auto width, int64_t k) {
    constexpr int W = decltype(width)::value;
    const Pack<T, W> pw = load<W>(w, k), pg = load<W>(g, k);
    Pack<T, W> pm = load<W>(m, k), pv = load<W>(v, k);
#pragma unroll
    for (int e = 0; e < W; ++e) {
      lamb_moments_element(pw.v[e], pg.v[e], pm.v[e], pv.v[e], c, p_sq, u_sq);
    }
    store<W>(m, k, pm);
    store<W>(v, k, pv);
  });
  p_sq = block_sum(p_sq, scratch);
  u_sq = block_sum(u_sq, scratch);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = p_sq;
    partials[gridDim.x + blockIdx.x] = u_sq;
  }
}

// One block: the trust ratio from `blocks` partials of each sum, as the CPU computes it.
__global__ void __launch_bounds__(kThreads)
    lamb_coeff_kernel(const double* __restrict__ partials, int blocks, double min_coeff,
                      double max_coeff, double* __restrict__ coeff) {
  __shared__ double scratch[32];
  double p_sq = 0, u_sq = 0;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) {
    p_sq += partials[b];
    u_sq += partials[blocks + b];
  }
  p_sq = block_sum(p_sq, scratch);
  u_sq = block_sum(u_sq, scratch);
  if (threadIdx.x == 0) {
    const double p_norm = sqrt(p_sq);
    const double u_norm = sqrt(u_sq);
    double c = 1.0;
    if (p_norm > 0 && u_norm > 0) {
      const double r = p_norm / u_norm;
      c = r < min_coeff ? min_coeff : (max_coeff < r ? max_coeff : r);  // std::clamp
    }
    *coeff = c;
  }
}

// Pass 2: p -= (lr c) u, u recomputed from the updated moments and the untouched p.
template <int VEC, class T>
__global__ void __launch_bounds__(kThreads)
    lamb_apply_kernel(T* __restrict__ w, const T* __restrict__ m, const T* __restrict__ v,
                      int64_t n, LambConsts<acc_t<T>> c, double lr,
                      const double* __restrict__ coeff) {
  using A = acc_t<T>;
  const A step = static_cast<A>(lr * *coeff);
  for_each_pack<VEC>(n, [&](auto width, int64_t k) {
    constexpr int W = decltype(width)::value;
    Pack<T, W> pw = load<W>(w, k);
    const Pack<T, W> pm = load<W>(m, k), pv = load<W>(v, k);
#pragma unroll
    for (int e = 0; e < W; ++e) {
      const A wi = to_acc(pw.v[e]);
      pw.v[e] = from_acc<T>(wi - step * lamb_update(to_acc(pm.v[e]), to_acc(pv.v[e]), wi, c));
    }
    store<W>(w, k, pw);
  });
}

// ---- SGD ---------------------------------------------------------------------------------

template <class A>
struct SgdConsts {
  A lr, mu, keep, wd;  // keep = 1 - dampening
  bool first_step, nesterov;
};

// One element (kernels/cpu/sgd.cc); `buf_io` is unused without momentum.
template <bool kMomentum, class T>
__device__ __forceinline__ void sgd_element(T& w_io, T g_in, T& buf_io,
                                            const SgdConsts<acc_t<T>>& c) {
  using A = acc_t<T>;
  const A w = to_acc(w_io);
  const A g = to_acc(g_in) + c.wd * w;
  if constexpr (!kMomentum) {
    w_io = from_acc<T>(w - c.lr * g);
  } else {
    const A buf = c.first_step ? g : c.mu * to_acc(buf_io) + c.keep * g;
    buf_io = from_acc<T>(buf);
    // The step uses the stored buffer, as the CPU does (it differs in half types only).
    const A b = to_acc(buf_io);
    w_io = from_acc<T>(w - (c.nesterov ? c.lr * (g + c.mu * b) : c.lr * b));
  }
}

template <bool kMomentum, int VEC, class T>
__global__ void __launch_bounds__(kThreads)
    sgd_kernel(T* __restrict__ w, const T* __restrict__ g, T* __restrict__ buf, int64_t n,
               SgdConsts<acc_t<T>> c) {
  for_each_pack<VEC>(n, [&](auto width, int64_t k) {
    constexpr int W = decltype(width)::value;
    Pack<T, W> pw = load<W>(w, k);
    const Pack<T, W> pg = load<W>(g, k);
    Pack<T, W> pb = {};
    if constexpr (kMomentum) pb = load<W>(buf, k);
#pragma unroll
    for (int e = 0; e < W; ++e) sgd_element<kMomentum>(pw.v[e], pg.v[e], pb.v[e], c);
    store<W>(w, k, pw);
    if constexpr (kMomentum) store<W>(buf, k, pb);
  });
}

// 1 - beta^step in f64, or 1 without bias correction (as the CPU).
double bias_correction(bool enabled, double beta, int64_t step) {
  return enabled ? 1 - std::pow(beta, static_cast<double>(step)) : 1;
}

template <class A>
AdamWConsts<A> adamw_consts(const AdamWParams& p, const Tensor& grad_scale) {
  const double bc1 = bias_correction(p.bias_correction, p.beta1, p.step);
  const double bc2 = bias_correction(p.bias_correction, p.beta2, p.step);
  return {static_cast<A>(p.lr),
          static_cast<A>(p.beta1),
          static_cast<A>(p.beta2),
          static_cast<A>(p.eps),
          static_cast<A>(p.weight_decay),
          static_cast<A>(1 / bc1),
          static_cast<A>(1 / bc2),
          !p.adam_w_mode,
          grad_scale.defined() ? ptr<const double>(grad_scale) : nullptr};
}

// Calls f(NoCopy tag) without model copies, else f with the copies' 16-bit type (every
// entry has one, of one dtype: kernels/adamw.cc checks).
template <class F>
void dispatch_copy(const std::vector<AdamWTensors>& tensors, const F& f) {
  const Tensor& copy = tensors.front().model_copy;
  if (!copy.defined()) return f(NoCopy{});
  if (copy.dtype() == DType::bf16) return f(__nv_bfloat16{});
  TS_INTERNAL_ASSERT(copy.dtype() == DType::f16, "adamw_step: a model copy in ",
                     dtype_name(copy.dtype()));
  f(__half{});
}

template <class C>
C* copy_ptr(const Tensor& copy) {
  if constexpr (std::is_same_v<C, NoCopy>) {
    return nullptr;
  } else {
    return ptr<C>(copy);
  }
}

// One launch for one tensor.
template <class T, class C>
void step_one(const AdamWTensors& t, const AdamWConsts<acc_t<T>>& c) {
  const int64_t n = t.param.numel();
  if (n == 0) return;
  constexpr int kVec = vec_of<T>();
  T* w = ptr<T>(t.param);
  const T* g = ptr<const T>(t.grad);
  T* m = ptr<T>(t.exp_avg);
  T* v = ptr<T>(t.exp_avg_sq);
  C* copy = copy_ptr<C>(t.model_copy);
  bool aligned = all_aligned<T, kVec>(w, g, m, v) && n >= kVec;
  if constexpr (!std::is_same_v<C, NoCopy>) aligned = aligned && aligned_for<C, kVec>(copy);
  if (aligned) {
    adamw_kernel<kVec><<<grid_for(n / kVec), kThreads, 0, kStream>>>(w, g, m, v, copy, n, c);
  } else {
    adamw_kernel<1><<<grid_for(n), kThreads, 0, kStream>>>(w, g, m, v, copy, n, c);
  }
}

}  // namespace

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq,
                const AdamWParams& p) {  // (*) each, contiguous, one dtype
  cuda::adamw_step(std::vector<AdamWTensors>{{param, grad, exp_avg, exp_avg_sq, Tensor()}}, p,
                   Tensor());
}

void adamw_step(const std::vector<AdamWTensors>& tensors, const AdamWParams& p,
                const Tensor& grad_scale) {
  if (tensors.empty()) return;
  set_device("adamw_step", tensors.front().param);
  // The process's driver, asked once (not on every step).
  static const int driver = [] {
    int version = 0;
    check_cuda(cudaDriverGetVersion(&version), "adamw_step", "cudaDriverGetVersion");
    return version;
  }();
  dispatch_cuda_floating(tensors.front().param.dtype(), "adamw_step", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const AdamWConsts<acc_t<T>> c = adamw_consts<acc_t<T>>(p, grad_scale);
    dispatch_copy(tensors, [&](auto copy_tag) {
      using C = decltype(copy_tag);
      if constexpr (!std::is_same_v<C, NoCopy> && !std::is_same_v<T, float>) {
        TS_INTERNAL_ASSERT(false, "adamw_step: model copies of a non-f32 parameter");
      } else if (driver < 12010) {  // Note [Multi-tensor AdamW]: no 20 KB kernel arguments
        for (const AdamWTensors& t : tensors) step_one<T, C>(t, c);
      } else {
        MultiTensorTable<T, C> table{};
        int slots = 0, blocks = 0;
        auto launch = [&] {
          if (blocks > 0) adamw_multi_kernel<T, C><<<blocks, kThreads, 0, kStream>>>(table, c);
          slots = 0;
          blocks = 0;
        };
        for (const AdamWTensors& t : tensors) {
          const int64_t n = t.param.numel();
          if (n == 0) continue;
          const int64_t chunks = (n + kMultiChunk - 1) / kMultiChunk;
          for (int64_t chunk = 0; chunk < chunks; ++chunk) {
            // A tensor whose chunks span two launches takes a slot in each.
            if (chunk == 0 || slots == 0) {
              if (slots == kMultiTensors) launch();
              table.w[slots] = ptr<T>(t.param);
              table.g[slots] = ptr<const T>(t.grad);
              table.m[slots] = ptr<T>(t.exp_avg);
              table.v[slots] = ptr<T>(t.exp_avg_sq);
              table.copy[slots] = copy_ptr<C>(t.model_copy);
              table.n[slots] = n;
              ++slots;
            }
            table.block_tensor[blocks] = static_cast<uint8_t>(slots - 1);
            table.block_chunk[blocks] = static_cast<int32_t>(chunk);
            if (++blocks == kMultiBlocks) launch();
          }
        }
        launch();
      }
    });
  });
  check_launch("adamw_step");
}

double lamb_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                 const Tensor& exp_avg_sq,
                 const LambParams& p) {  // (*) each, contiguous, one dtype -> trust ratio
  const int64_t n = param.numel();
  if (n == 0) return 1.0;  // both norms are 0
  set_device("lamb_step", param);
  const double bc1 = bias_correction(p.bias_correction, p.beta1, p.step);
  const double bc2 = bias_correction(p.bias_correction, p.beta2, p.step);
  // A function of n only (Note [LAMB on the device]).
  const int64_t per_block = int64_t{kThreads} * 8;
  const int blocks = static_cast<int>(
      std::min<int64_t>(kMaxReduceBlocks, std::max<int64_t>(1, (n + per_block - 1) / per_block)));
  // partials of |p|^2 [0, blocks), of |u|^2 [blocks, 2 blocks), then the trust ratio.
  const Tensor scratch = empty({2 * int64_t{blocks} + 1}, {DType::f64, param.device()});
  double* partials = ptr<double>(scratch);
  double* coeff = partials + 2 * blocks;
  dispatch_cuda_floating(param.dtype(), "lamb_step", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    constexpr int kVec = vec_of<T>();
    const LambConsts<A> c{static_cast<A>(p.beta1), static_cast<A>(p.beta2),
                          static_cast<A>(p.eps),   static_cast<A>(p.weight_decay),
                          static_cast<A>(1 / bc1), static_cast<A>(1 / bc2),
                          p.eps_inside_sqrt};
    T* w = ptr<T>(param);
    const T* g = ptr<const T>(grad);
    T* m = ptr<T>(exp_avg);
    T* v = ptr<T>(exp_avg_sq);
    const bool vec = all_aligned<T, kVec>(w, g, m, v);
    if (vec) {
      lamb_moments_kernel<kVec><<<blocks, kThreads, 0, kStream>>>(w, g, m, v, n, c, partials);
    } else {
      lamb_moments_kernel<1><<<blocks, kThreads, 0, kStream>>>(w, g, m, v, n, c, partials);
    }
    check_launch("lamb_step");
    lamb_coeff_kernel<<<1, kThreads, 0, kStream>>>(partials, blocks, p.min_coeff, p.max_coeff,
                                                   coeff);
    check_launch("lamb_step");
    if (vec && n >= kVec) {
      lamb_apply_kernel<kVec>
          <<<grid_for(n / kVec), kThreads, 0, kStream>>>(w, m, v, n, c, p.lr, coeff);
    } else {
      lamb_apply_kernel<1><<<grid_for(n), kThreads, 0, kStream>>>(w, m, v, n, c, p.lr, coeff);
    }
    check_launch("lamb_step");
  });
  double result = 1.0;
  // Synchronous on the compute stream: waits for the three kernels (Note [One compute stream]).
  check_cuda(cudaMemcpy(&result, coeff, sizeof(double), cudaMemcpyDeviceToHost), "lamb_step",
             "cudaMemcpy");
  return result;
}

void sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
              const SgdParams& p) {  // (*) each, contiguous; momentum_buffer may be undefined
  const int64_t n = param.numel();
  if (n == 0) return;
  set_device("sgd_step", param);
  const bool momentum = p.momentum != 0.0;
  dispatch_cuda_floating(param.dtype(), "sgd_step", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    constexpr int kVec = vec_of<T>();
    const SgdConsts<A> c{static_cast<A>(p.lr),
                         static_cast<A>(p.momentum),
                         static_cast<A>(1 - p.dampening),
                         static_cast<A>(p.weight_decay),
                         p.first_step,
                         p.nesterov};
    T* w = ptr<T>(param);
    const T* g = ptr<const T>(grad);
    T* buf = momentum ? ptr<T>(momentum_buffer) : nullptr;
    const bool vec =
        (momentum ? all_aligned<T, kVec>(w, g, buf) : all_aligned<T, kVec>(w, g)) && n >= kVec;
    const unsigned grid = vec ? grid_for(n / kVec) : grid_for(n);
    if (momentum && vec) {
      sgd_kernel<true, kVec><<<grid, kThreads, 0, kStream>>>(w, g, buf, n, c);
    } else if (momentum) {
      sgd_kernel<true, 1><<<grid, kThreads, 0, kStream>>>(w, g, buf, n, c);
    } else if (vec) {
      sgd_kernel<false, kVec><<<grid, kThreads, 0, kStream>>>(w, g, buf, n, c);
    } else {
      sgd_kernel<false, 1><<<grid, kThreads, 0, kStream>>>(w, g, buf, n, c);
    }
  });
  check_launch("sgd_step");
}

}  // namespace tessera::kernels::cuda
