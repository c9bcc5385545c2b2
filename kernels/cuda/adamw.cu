// The fused AdamW step on CUDA (kernels/adamw.h), with the math of kernels/cpu/adamw.cc in
// the accumulation type: one tensor per launch, or the whole list in a few (Note
// [Multi-tensor AdamW]), optionally scaled and writing 16-bit model copies (Note [Scaled
// AdamW]).
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/half_bits.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/optimizer_packs.cuh"

namespace tessera::kernels::cuda {
namespace {

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
// and rounded to T (a multiply rounded on its own, never fused into the L2 decay's add), and
// the update goes on as without. With a model copy (C not NoCopy) the updated f32
// parameter is also rounded into its 16-bit tensor by Tensor::copy_'s conversion
// (core/half_bits.h). So the step equals scale_, adamw_step and copy_ in turn, bit for
// bit, in one pass over memory.
struct NoCopy {};    // no model copies
struct CopyF16 {};   // f16 model copies
struct CopyBf16 {};  // bf16 model copies

// The 16-bit bits of an updated f32 parameter in the copy's format.
template <class C>
__device__ __forceinline__ uint16_t copy_bits(float w) {
  if constexpr (std::is_same_v<C, CopyF16>) {
    return float_to_f16_bits(w);
  } else {
    return float_to_bf16_bits(w);
  }
}

// a * b rounded by itself: nvcc would otherwise fuse it into a following add.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

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
  A g = to_acc(from_acc<T>(mul_rn(to_acc(g_in), scale)));
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
__device__ __forceinline__ void adamw_pack(T* w, const T* g, T* m, T* v, uint16_t* copy, int64_t k,
                                           const AdamWConsts<acc_t<T>>& c, acc_t<T> scale) {
  Pack<T, W> pw = load<W>(w, k), pm = load<W>(m, k), pv = load<W>(v, k);
  const Pack<T, W> pg = load<W>(g, k);
#pragma unroll
  for (int e = 0; e < W; ++e) adamw_element(pw.v[e], pg.v[e], pm.v[e], pv.v[e], c, scale);
  store<W>(w, k, pw);
  store<W>(m, k, pm);
  store<W>(v, k, pv);
  if constexpr (!std::is_same_v<C, NoCopy>) {
    Pack<uint16_t, W> pc;
#pragma unroll
    for (int e = 0; e < W; ++e) pc.v[e] = copy_bits<C>(to_acc(pw.v[e]));
    store<W>(copy, k, pc);
  }
}

template <int VEC, class T, class C>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(T* __restrict__ w, const T* __restrict__ g, T* __restrict__ m, T* __restrict__ v,
                 uint16_t* __restrict__ copy, int64_t n, AdamWConsts<acc_t<T>> c) {
  acc_t<T> scale;
  if (!step_scale(c.grad_scale, &scale)) return;
  for_each_pack<VEC>(n, [&](auto width, int64_t k) {
    adamw_pack<decltype(width)::value, T, C>(w, g, m, v, copy, k, c, scale);
  });
}

// Note [Multi-tensor AdamW]
// A GPT has a few hundred parameters, most of them small: one launch each costs more in
// launch latency than the math. The multi-tensor kernel takes a table of up to
// kMultiTensors tensors and kMultiBlocks (tensor, chunk) pairs in its arguments (about 22
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
  uint16_t* copy[kMultiTensors];  // 16-bit model copies; unused with NoCopy
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
  uint16_t* copy = nullptr;
  if constexpr (!std::is_same_v<C, NoCopy>) copy = table.copy[t] + begin;
  // kMultiChunk is a multiple of kVec: a chunk is aligned when its tensor is.
  bool aligned = ((reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(g) |
                   reinterpret_cast<uintptr_t>(m) | reinterpret_cast<uintptr_t>(v)) %
                  (sizeof(T) * kVec)) == 0;
  if constexpr (!std::is_same_v<C, NoCopy>) {
    aligned = aligned && reinterpret_cast<uintptr_t>(copy) % (sizeof(uint16_t) * kVec) == 0;
  }
  const int64_t packs = aligned ? count / kVec : 0;
  for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
    adamw_pack<kVec, T, C>(w, g, m, v, copy, k, c, scale);
  }
  for (int64_t i = packs * kVec + threadIdx.x; i < count; i += blockDim.x) {
    adamw_pack<1, T, C>(w, g, m, v, copy, i, c, scale);
  }
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

// Calls f(NoCopy{}) without model copies, else f with the copies' format tag (every entry
// has one, of one dtype: kernels/adamw.cc checks).
template <class F>
void dispatch_copy(const std::vector<AdamWTensors>& tensors, const F& f) {
  const Tensor& copy = tensors.front().model_copy;
  if (!copy.defined()) return f(NoCopy{});
  if (copy.dtype() == DType::bf16) return f(CopyBf16{});
  TS_INTERNAL_ASSERT(copy.dtype() == DType::f16, "adamw_step: a model copy in ",
                     dtype_name(copy.dtype()));
  f(CopyF16{});
}

// The copy's 16-bit words; null without one.
uint16_t* copy_ptr(const Tensor& copy) {
  return copy.defined() ? static_cast<uint16_t*>(copy.raw_data()) : nullptr;
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
  uint16_t* copy = copy_ptr(t.model_copy);
  bool aligned = all_aligned<T, kVec>(w, g, m, v) && n >= kVec;
  if constexpr (!std::is_same_v<C, NoCopy>) {
    aligned = aligned && aligned_for<uint16_t, kVec>(copy);
  }
  if (aligned) {
    adamw_kernel<kVec, T, C><<<grid_for(n / kVec), kThreads, 0, kStream>>>(w, g, m, v, copy, n, c);
  } else {
    adamw_kernel<1, T, C><<<grid_for(n), kThreads, 0, kStream>>>(w, g, m, v, copy, n, c);
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
              table.copy[slots] = copy_ptr(t.model_copy);
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

}  // namespace tessera::kernels::cuda
