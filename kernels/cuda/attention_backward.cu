// cuda::causal_attention_backward: delta, then dK/dV over key tiles and dQ over query tiles
// (see Note [Flash attention on CUDA] in kernels/cuda/attention_tiles.cuh).
#include "core/factories.h"
#include "kernels/cuda/attention_tiles.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels::cuda {
namespace {

using namespace flash;  // NOLINT: this file's own helpers, see attention_tiles.cuh

// delta[row] = dout[row] . out[row], one warp per row.
template <class T>
__global__ void attention_delta_kernel(const T* __restrict__ dout,    // (rows, D)
                                       const T* __restrict__ out,     // (rows, D)
                                       acc_t<T>* __restrict__ delta,  // (rows)
                                       int64_t rows, int dim) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; row < rows; row += warps) {
    acc_t<T> acc = 0;
    for (int d = lane; d < dim; d += 32)
      acc += to_acc(dout[row * dim + d]) * to_acc(out[row * dim + d]);
    acc = warp_sum(acc);
    if (lane == 0) delta[row] = acc;
  }
}

// The block owns kBr = 64 keys (32 for f64) and streams kBc = 32 queries (16) a step.
template <class T, int kD>
using KeyTiles = Tiles<T, kD, sizeof(acc_t<T>) == 8 ? 2 : 4, sizeof(acc_t<T>) == 8 ? 1 : 2>;

template <class Cfg>
constexpr size_t dkdv_smem() {
  // ks, vs (owned, kBr = keys here), qs, dos (streamed), pt (kBr, kLdS), lse, delta.
  return sizeof(typename Cfg::A) * (2 * Cfg::kOwn + 2 * Cfg::kStream + Cfg::kScores + 2 * Cfg::kBc);
}

template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    attention_dkdv_kernel(const T* __restrict__ q,             // (B*H, T, D)
                          const T* __restrict__ k,             // (B*H, T, D)
                          const T* __restrict__ v,             // (B*H, T, D)
                          const T* __restrict__ dout,          // (B*H, T, D)
                          const acc_t<T>* __restrict__ lse,    // (B*H, T)
                          const acc_t<T>* __restrict__ delta,  // (B*H, T)
                          T* __restrict__ dk,                  // (B*H, T, D)
                          T* __restrict__ dv,                  // (B*H, T, D)
                          int64_t len, int dim, acc_t<T> scale, FlashDropout<acc_t<T>> drop) {
  // The block owns kBr keys and streams query tiles of kBc rows.
  using Cfg = KeyTiles<T, kD>;
  using A = typename Cfg::A;
  constexpr int kRK = Cfg::kBr / 16;
  constexpr int kRQ = Cfg::kBc / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  A* ks = reinterpret_cast<A*>(smem);  // (keys, kLd)
  A* vs = ks + Cfg::kOwn;              // (keys, kLd)
  A* qs = vs + Cfg::kOwn;              // (queries, kLd)
  A* dos = qs + Cfg::kStream;          // (queries, kLd)
  A* pt = dos + Cfg::kStream;          // (keys, kLdS): p, then ds, transposed
  A* lse_s = pt + Cfg::kScores;        // (queries)
  A* delta_s = lse_s + Cfg::kBc;       // (queries)
  const int tx = threadIdx.x % 16;
  const int ty = threadIdx.x / 16;
  const int64_t head = static_cast<int64_t>(blockIdx.x) * len * dim;
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * Cfg::kBr;

  load_tile<Cfg::kBr, kD, Cfg::kLd>(ks, k + head, k0, len, dim);
  load_tile<Cfg::kBr, kD, Cfg::kLd>(vs, v + head, k0, len, dim);
  A dk_acc[kRK][Cfg::kCols] = {};
  A dv_acc[kRK][Cfg::kCols] = {};
  for (int64_t q0 = k0; q0 < len; q0 += Cfg::kBc) {  // queries before k0 see none of its keys
    __syncthreads();  // the previous step's readers are done with qs, dos and pt
    load_tile<Cfg::kBc, kD, Cfg::kLd>(qs, q + head, q0, len, dim);
    load_tile<Cfg::kBc, kD, Cfg::kLd>(dos, dout + head, q0, len, dim);
    load_stat(lse_s, lse + blockIdx.x * len, q0, len, Cfg::kBc);
    load_stat(delta_s, delta + blockIdx.x * len, q0, len, Cfg::kBc);
    __syncthreads();
    A s[kRK][kRQ] = {};
    A dp[kRK][kRQ] = {};
    tile_dots<kRK, kRQ, kD, Cfg::kLd>(s, ks, qs, ty, tx);    // k[c] . q[r]
    tile_dots<kRK, kRQ, kD, Cfg::kLd>(dp, vs, dos, ty, tx);  // v[c] . dout[r]
#pragma unroll
    for (int i = 0; i < kRK; ++i)
#pragma unroll
      for (int j = 0; j < kRQ; ++j) {
        const int64_t c = k0 + ty + 16 * i;
        const int64_t r = q0 + tx + 16 * j;
        const int at = tx + 16 * j;
        const bool visible = r < len && c <= r;
        const A p = visible ? exp_acc(s[i][j] * scale - lse_s[at]) : A(0);
        // Note [Dropout in the flash kernels]: p * f multiplied dout into dv, dp * f is dP.
        const A f = drop.drops() && visible ? drop.factor(blockIdx.x, r, c, len) : A(1);
        pt[(ty + 16 * i) * Cfg::kLdS + at] = p * f;
        s[i][j] = p * (dp[i][j] * f - delta_s[at]);  // ds
      }
    __syncthreads();
    tile_mix<kRK, Cfg::kBc, Cfg::kLdS, Cfg>(dv_acc, pt, dos, ty, tx);
    // p and ds take turns in one buffer: the smaller footprint fits two blocks per SM.
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRK; ++i)
#pragma unroll
      for (int j = 0; j < kRQ; ++j) pt[(ty + 16 * i) * Cfg::kLdS + tx + 16 * j] = s[i][j];
    __syncthreads();
    tile_mix<kRK, Cfg::kBc, Cfg::kLdS, Cfg>(dk_acc, pt, qs, ty, tx);
  }
  A one[kRK], scaled[kRK];
#pragma unroll
  for (int i = 0; i < kRK; ++i) {
    one[i] = A(1);
    scaled[i] = scale;
  }
  store_rows<kRK, Cfg>(dk + head, dk_acc, scaled, k0, len, dim, ty, tx);
  store_rows<kRK, Cfg>(dv + head, dv_acc, one, k0, len, dim, ty, tx);
}

// The block owns kBr = 64 queries (32 for f64) and streams kBc = 32 keys (16) a step.
template <class T, int kD>
using QueryTiles = Tiles<T, kD, sizeof(acc_t<T>) == 8 ? 2 : 4, sizeof(acc_t<T>) == 8 ? 1 : 2>;

template <class Cfg>
constexpr size_t dq_smem() {
  // qs, dos (owned), ks, vs (streamed), ds unless it fits in vs, lse, delta.
  return sizeof(typename Cfg::A) *
         (2 * Cfg::kOwn + 2 * Cfg::kStream + (Cfg::kScoresFit ? 0 : Cfg::kScores) + 2 * Cfg::kBr);
}

template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(const T* __restrict__ q,             // (B*H, T, D)
                        const T* __restrict__ k,             // (B*H, T, D)
                        const T* __restrict__ v,             // (B*H, T, D)
                        const T* __restrict__ dout,          // (B*H, T, D)
                        const acc_t<T>* __restrict__ lse,    // (B*H, T)
                        const acc_t<T>* __restrict__ delta,  // (B*H, T)
                        T* __restrict__ dq,                  // (B*H, T, D)
                        int64_t len, int dim, acc_t<T> scale, FlashDropout<acc_t<T>> drop) {
  using Cfg = QueryTiles<T, kD>;
  using A = typename Cfg::A;
  constexpr int kRQ = Cfg::kBr / 16;
  constexpr int kRK = Cfg::kBc / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  A* qs = reinterpret_cast<A*>(smem);                                   // (Br, kLd)
  A* dos = qs + Cfg::kOwn;                                              // (Br, kLd)
  A* ks = dos + Cfg::kOwn;                                              // (Bc, kLd)
  A* vs = ks + Cfg::kStream;                                            // (Bc, kLd)
  A* dss = Cfg::kScoresFit ? vs : vs + Cfg::kStream;                    // (Br, kLdS)
  A* lse_s = vs + Cfg::kStream + (Cfg::kScoresFit ? 0 : Cfg::kScores);  // (Br)
  A* delta_s = lse_s + Cfg::kBr;                                        // (Br)
  const int tx = threadIdx.x % 16;
  const int ty = threadIdx.x / 16;
  const int64_t head = static_cast<int64_t>(blockIdx.x) * len * dim;
  const int64_t q0 = static_cast<int64_t>(gridDim.y - 1 - blockIdx.y) * Cfg::kBr;

  load_tile<Cfg::kBr, kD, Cfg::kLd>(qs, q + head, q0, len, dim);
  load_tile<Cfg::kBr, kD, Cfg::kLd>(dos, dout + head, q0, len, dim);
  load_stat(lse_s, lse + blockIdx.x * len, q0, len, Cfg::kBr);
  load_stat(delta_s, delta + blockIdx.x * len, q0, len, Cfg::kBr);
  A acc[kRQ][Cfg::kCols] = {};
  const int64_t key_end = q0 + Cfg::kBr < len ? q0 + Cfg::kBr : len;
  for (int64_t k0 = 0; k0 < key_end; k0 += Cfg::kBc) {
    __syncthreads();  // the previous tile's readers are done with ks, vs and dss
    load_tile<Cfg::kBc, kD, Cfg::kLd>(ks, k + head, k0, len, dim);
    load_tile<Cfg::kBc, kD, Cfg::kLd>(vs, v + head, k0, len, dim);
    __syncthreads();
    A s[kRQ][kRK] = {};
    A dp[kRQ][kRK] = {};
    tile_dots<kRQ, kRK, kD, Cfg::kLd>(s, qs, ks, ty, tx);
    tile_dots<kRQ, kRK, kD, Cfg::kLd>(dp, dos, vs, ty, tx);
#pragma unroll
    for (int i = 0; i < kRQ; ++i)
#pragma unroll
      for (int j = 0; j < kRK; ++j) {
        const int64_t r = q0 + ty + 16 * i;
        const int64_t c = k0 + tx + 16 * j;
        const int at = ty + 16 * i;
        const bool visible = r < len && c <= r;
        const A p = visible ? exp_acc(s[i][j] * scale - lse_s[at]) : A(0);
        const A f = drop.drops() && visible ? drop.factor(blockIdx.x, r, c, len) : A(1);
        s[i][j] = p * (dp[i][j] * f - delta_s[at]);
      }
    if constexpr (Cfg::kScoresFit) __syncthreads();  // dss overwrites vs
#pragma unroll
    for (int i = 0; i < kRQ; ++i)
#pragma unroll
      for (int j = 0; j < kRK; ++j) dss[(ty + 16 * i) * Cfg::kLdS + tx + 16 * j] = s[i][j];
    __syncthreads();
    tile_mix<kRQ, Cfg::kBc, Cfg::kLdS, Cfg>(acc, dss, ks, ty, tx);
  }
  A scaled[kRQ];
#pragma unroll
  for (int i = 0; i < kRQ; ++i) scaled[i] = scale;
  store_rows<kRQ, Cfg>(dq + head, acc, scaled, q0, len, dim, ty, tx);
}

}  // namespace

AttentionGrads flash_causal_attention_backward(const Tensor& dout_in, const Tensor& q_in,
                                               const Tensor& k_in, const Tensor& v_in,
                                               const Tensor& out_in, const Tensor& lse_in,
                                               double scale, const AttentionDropout& dropout) {
  constexpr const char* op = "causal_attention_backward";
  const Tensor dout = dout_in.detach().contiguous();  // (B, H, T, D)
  const Tensor q = q_in.detach().contiguous();        // (B, H, T, D)
  const Tensor k = k_in.detach().contiguous();        // (B, H, T, D)
  const Tensor v = v_in.detach().contiguous();        // (B, H, T, D)
  const Tensor out = out_in.detach().contiguous();    // (B, H, T, D)
  const Tensor lse = lse_in.detach().contiguous();    // (B, H, T)
  const DType stats = stat_dtype(q.dtype());
  TS_CHECK(lse.dtype() == stats, "[", op, "] expected lse of dtype ", dtype_name(stats), " for ",
           dtype_name(q.dtype()), " inputs, found ", dtype_name(lse.dtype()));
  const TensorOptions options{q.dtype(), q.device()};
  AttentionGrads grads{empty(q.shape(), options), empty(q.shape(), options),
                       empty(q.shape(), options)};
  if (q.numel() == 0) return grads;
  const int64_t heads = q.size(0) * q.size(1);
  const int64_t len = q.size(2);
  const int64_t dim = q.size(3);
  set_device(op, q);
  const Tensor delta = empty({heads * len}, {stats, q.device()});  // (B*H*T)
  dispatch_cuda_floating(q.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    attention_delta_kernel<T><<<grid_for(heads * len * 32), kThreads, 0, kStream>>>(
        ptr<T>(dout), ptr<T>(out), ptr<A>(delta), heads * len, static_cast<int>(dim));
    check_launch(op);
    dispatch_head_dim(op, dim, [&](auto width) {
      constexpr int kD = decltype(width)::value;
      using KeyCfg = KeyTiles<T, kD>;
      using QueryCfg = QueryTiles<T, kD>;
      static_assert(dkdv_smem<KeyCfg>() <= kMaxSharedBytes &&
                    dq_smem<QueryCfg>() <= kMaxSharedBytes);
      launch(op, attention_dkdv_kernel<T, kD>, tile_grid(op, heads, len, KeyCfg::kBr),
             dkdv_smem<KeyCfg>(), ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(dout), ptr<A>(lse),
             ptr<A>(delta), ptr<T>(grads.dk), ptr<T>(grads.dv), len, static_cast<int>(dim),
             static_cast<A>(scale), flash_dropout<A>(dropout));
      launch(op, attention_dq_kernel<T, kD>, tile_grid(op, heads, len, QueryCfg::kBr),
             dq_smem<QueryCfg>(), ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(dout), ptr<A>(lse),
             ptr<A>(delta), ptr<T>(grads.dq), len, static_cast<int>(dim), static_cast<A>(scale),
             flash_dropout<A>(dropout));
    });
  });
  return grads;
}

}  // namespace tessera::kernels::cuda
