// CUDA optimizer steps: LAMB (deterministic device norms) and SGD, with the math of
// kernels/cpu/{lamb,sgd}.cc in the accumulation type (AdamW: kernels/cuda/adamw.cu).
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
#include "kernels/cuda/optimizer_packs.cuh"

namespace tessera::kernels::cuda {
namespace {

constexpr int kMaxReduceBlocks = 1024;

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

}  // namespace

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
