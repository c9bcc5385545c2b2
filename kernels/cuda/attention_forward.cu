// cuda::causal_attention: the flash attention forward (see Note [Flash attention on CUDA]
// in kernels/cuda/attention_tiles.cuh).
#include "core/factories.h"
#include "kernels/cuda/attention_tiles.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels::cuda {
namespace {

using namespace flash;  // NOLINT: this file's own helpers, see attention_tiles.cuh

template <class T, int kD>
using ForwardTiles = Tiles<T, kD, sizeof(acc_t<T>) == 8 ? 2 : 4, sizeof(acc_t<T>) == 8 ? 2 : 4>;

template <class Cfg>
constexpr size_t forward_smem() {
  return sizeof(typename Cfg::A) *
         (Cfg::kOwn + 2 * Cfg::kStream + (Cfg::kScoresFit ? 0 : Cfg::kScores));
}

template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(const T* __restrict__ q,     // (B*H, T, D)
                             const T* __restrict__ k,     // (B*H, T, D)
                             const T* __restrict__ v,     // (B*H, T, D)
                             T* __restrict__ out,         // (B*H, T, D)
                             acc_t<T>* __restrict__ lse,  // (B*H, T)
                             int64_t len, int dim, acc_t<T> scale, FlashDropout<acc_t<T>> drop) {
  using Cfg = ForwardTiles<T, kD>;
  using A = typename Cfg::A;
  constexpr int kRQ = Cfg::kBr / 16;
  constexpr int kRK = Cfg::kBc / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  A* qs = reinterpret_cast<A*>(smem);                // (Br, kLd)
  A* ks = qs + Cfg::kOwn;                            // (Bc, kLd)
  A* vs = ks + Cfg::kStream;                         // (Bc, kLd)
  A* ps = Cfg::kScoresFit ? ks : vs + Cfg::kStream;  // (Br, kLdS)
  const int tx = threadIdx.x % 16;
  const int ty = threadIdx.x / 16;
  const int64_t head = static_cast<int64_t>(blockIdx.x) * len * dim;
  const int64_t q0 = static_cast<int64_t>(gridDim.y - 1 - blockIdx.y) * Cfg::kBr;

  load_tile<Cfg::kBr, kD, Cfg::kLd>(qs, q + head, q0, len, dim);
  A m[kRQ], l[kRQ], o[kRQ][Cfg::kCols];
#pragma unroll
  for (int i = 0; i < kRQ; ++i) {
    m[i] = A(-INFINITY);
    l[i] = A(0);  // this thread's share of the row sum, reduced at the end
#pragma unroll
    for (int c = 0; c < Cfg::kCols; ++c) o[i][c] = A(0);
  }

  const int64_t key_end = q0 + Cfg::kBr < len ? q0 + Cfg::kBr : len;
  for (int64_t k0 = 0; k0 < key_end; k0 += Cfg::kBc) {
    __syncthreads();  // the previous tile's readers are done with ks, vs and ps
    load_tile<Cfg::kBc, kD, Cfg::kLd>(ks, k + head, k0, len, dim);
    load_tile<Cfg::kBc, kD, Cfg::kLd>(vs, v + head, k0, len, dim);
    __syncthreads();
    A s[kRQ][kRK] = {};
    tile_dots<kRQ, kRK, kD, Cfg::kLd>(s, qs, ks, ty, tx);
#pragma unroll
    for (int i = 0; i < kRQ; ++i) {
      const int64_t r = q0 + ty + 16 * i;
      A tile_max = A(-INFINITY);
#pragma unroll
      for (int j = 0; j < kRK; ++j) {
        const int64_t c = k0 + tx + 16 * j;
        s[i][j] = c > r ? A(-INFINITY) : s[i][j] * scale;  // keys past T are past every row
        tile_max = max_acc(tile_max, s[i][j]);
      }
      for (int o16 = 8; o16 > 0; o16 >>= 1)  // the row's 16 threads share a half warp
        tile_max = max_acc(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, o16));
      const A m_new = max_acc(m[i], tile_max);
      const A base = m_new == A(-INFINITY) ? A(0) : m_new;  // a row with no key yet
      const A alpha = exp_acc(m[i] - base);
      m[i] = m_new;
      A sum = A(0);
#pragma unroll
      for (int j = 0; j < kRK; ++j) {
        s[i][j] = exp_acc(s[i][j] - base);
        sum += s[i][j];
      }
      l[i] = l[i] * alpha + sum;
#pragma unroll
      for (int c = 0; c < Cfg::kCols; ++c) o[i][c] *= alpha;
      if (drop.drops() && r < len) {  // Note [Dropout in the flash kernels]
#pragma unroll
        for (int j = 0; j < kRK; ++j) {
          const int64_t c = k0 + tx + 16 * j;
          if (c <= r) s[i][j] *= drop.factor(blockIdx.x, r, c, len);
        }
      }
    }
    if constexpr (Cfg::kScoresFit) __syncthreads();  // ps overwrites ks
#pragma unroll
    for (int i = 0; i < kRQ; ++i)
#pragma unroll
      for (int j = 0; j < kRK; ++j) ps[(ty + 16 * i) * Cfg::kLdS + tx + 16 * j] = s[i][j];
    __syncthreads();
    tile_mix<kRQ, Cfg::kBc, Cfg::kLdS, Cfg>(o, ps, vs, ty, tx);
  }

  A inv[kRQ];
#pragma unroll
  for (int i = 0; i < kRQ; ++i) {
    for (int o16 = 8; o16 > 0; o16 >>= 1) l[i] += __shfl_xor_sync(0xffffffffu, l[i], o16);
    inv[i] = A(1) / l[i];
    const int64_t r = q0 + ty + 16 * i;
    if (tx == 0 && r < len) lse[blockIdx.x * len + r] = m[i] + log_acc(l[i]);
  }
  store_rows<kRQ, Cfg>(out + head, o, inv, q0, len, dim, ty, tx);
}

}  // namespace

AttentionOutput flash_causal_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                       double scale, const AttentionDropout& dropout) {
  constexpr const char* op = "causal_attention";
  const Tensor q = q_in.detach().contiguous();  // (B, H, T, D)
  const Tensor k = k_in.detach().contiguous();  // (B, H, T, D)
  const Tensor v = v_in.detach().contiguous();  // (B, H, T, D)
  const int64_t heads = q.size(0) * q.size(1);
  const int64_t len = q.size(2);
  const int64_t dim = q.size(3);
  AttentionOutput result{empty(q.shape(), {q.dtype(), q.device()}),
                         empty({q.size(0), q.size(1), len}, {stat_dtype(q.dtype()), q.device()})};
  if (heads == 0 || len == 0) return result;  // D = 0 still has lse = log(t + 1)
  set_device(op, q);
  dispatch_cuda_floating(q.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    dispatch_head_dim(op, dim, [&](auto width) {
      constexpr int kD = decltype(width)::value;
      using Cfg = ForwardTiles<T, kD>;
      static_assert(forward_smem<Cfg>() <= kMaxSharedBytes);
      launch(op, attention_forward_kernel<T, kD>, tile_grid(op, heads, len, Cfg::kBr),
             forward_smem<Cfg>(), ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(result.out),
             ptr<A>(result.lse), len, static_cast<int>(dim), static_cast<A>(scale),
             flash_dropout<A>(dropout));
    });
  });
  return result;
}

}  // namespace tessera::kernels::cuda
