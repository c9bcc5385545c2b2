// CUDA fused softmax cross-entropy: per-row log-sum-exp and loss without materializing
// probabilities, a fixed-order mean over rows, and the fused backward.
//
// Note [Row kernels]
// A block owns a row at a time (grid-stride over rows) and sizes itself to the row, up to
// kMaxRowThreads. Rows are read in 16-byte packs when every pointer of the row has the same
// offset from a 16-byte boundary (a scalar head reaches the boundary, a scalar tail ends
// the row), otherwise element by element. Each thread accumulates its elements in order
// and the block combines threads in a fixed tree (block_sum), so results are reproducible.
// (The same helpers live in softmax.cu and layer_norm.cu.)
//
// Note [CUDA cross-entropy targets]
// The CPU throws on a target outside [0, V) that is not ignore_index. Here the row kernels
// never index the logits with such a target: they record the lowest such row in a device
// word (atomicMin, so the row is the CPU's first) and the host reads it back after the
// launches, one synchronization per call, to throw the CPU's message.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/factories.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels::cuda {
namespace {

constexpr int kMaxRowThreads = 256;
constexpr int kCountThreads = 1024;           // the single block that reduces over rows
constexpr int64_t kMaxGrid = 65535 * 8;       // blocks per launch; grid-stride loops do the rest
constexpr unsigned long long kNoRow = ~0ull;  // the bad-row word when every target is valid

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ float exp_acc(float v) { return expf(v); }
__device__ __forceinline__ double exp_acc(double v) { return exp(v); }
__device__ __forceinline__ float log_acc(float v) { return logf(v); }
__device__ __forceinline__ double log_acc(double v) { return log(v); }

// N elements of T loaded or stored as one 16-byte access.
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// A pack seen as one uint4, so that the compiler emits one 16-byte load or store.
template <class T, int N>
union PackBits {
  uint4 bits;
  Pack<T, N> pack;
};

template <class T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  PackBits<T, N> u;
  u.bits = __ldg(reinterpret_cast<const uint4*>(p));
  return u.pack;
}

template <class T, int N>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, N>& v) {
  PackBits<T, N> u;
  u.pack = v;
  // __stwb is an ordinary store; a plain uint4 assignment was split into 4-byte stores.
  __stwb(reinterpret_cast<uint4*>(p), u.bits);
}

// Elements before the first 16-byte boundary at or after p, or all n when the row cannot
// be read in packs (the other pointers sit at another offset from a boundary).
template <class T>
__device__ __forceinline__ int64_t head_of(const T* p, bool same_offset, int64_t n) {
  const uintptr_t offset = reinterpret_cast<uintptr_t>(p) % 16;
  if (!same_offset) return n;
  return offset == 0 ? 0 : imin(n, static_cast<int64_t>((16 - offset) / sizeof(T)));
}

template <class T>
__device__ __forceinline__ bool same_offset(const T* a, const T* b) {
  return b == nullptr || reinterpret_cast<uintptr_t>(a) % 16 == reinterpret_cast<uintptr_t>(b) % 16;
}

// Calls fn(j, a[j], b[j]) (b[j] read as 0 when b is null) for the j < n this thread owns
// (Note [Row kernels]).
template <class T, class F>
__device__ __forceinline__ void visit_row(const T* a, const T* b, int64_t n, F&& fn) {
  using A = acc_t<T>;
  constexpr int N = 16 / sizeof(T);
  const int64_t head = head_of(a, same_offset(a, b), n);
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) {
    fn(j, to_acc(a[j]), b == nullptr ? A(0) : to_acc(b[j]));
  }
  const int64_t packs = (n - head) / N;
  for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
    const int64_t j = head + k * N;
    const Pack<T, N> pa = load_pack<T, N>(a + j);
    Pack<T, N> pb{};
    if (b != nullptr) pb = load_pack<T, N>(b + j);
#pragma unroll
    for (int i = 0; i < N; ++i) fn(j + i, to_acc(pa.v[i]), b == nullptr ? A(0) : to_acc(pb.v[i]));
  }
  for (int64_t j = head + packs * N + threadIdx.x; j < n; j += blockDim.x) {
    fn(j, to_acc(a[j]), b == nullptr ? A(0) : to_acc(b[j]));
  }
}

// out[j] = fn(j, a[j], b[j]) for the j < n this thread owns, as visit_row.
template <class T, class F>
__device__ __forceinline__ void map_row(const T* a, const T* b, T* out, int64_t n, F&& fn) {
  using A = acc_t<T>;
  constexpr int N = 16 / sizeof(T);
  const int64_t head = head_of(a, same_offset(a, b) && same_offset<T>(a, out), n);
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) {
    out[j] = from_acc<T>(fn(j, to_acc(a[j]), b == nullptr ? A(0) : to_acc(b[j])));
  }
  const int64_t packs = (n - head) / N;
  for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
    const int64_t j = head + k * N;
    const Pack<T, N> pa = load_pack<T, N>(a + j);
    Pack<T, N> pb{};
    if (b != nullptr) pb = load_pack<T, N>(b + j);
    Pack<T, N> po;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      po.v[i] = from_acc<T>(fn(j + i, to_acc(pa.v[i]), b == nullptr ? A(0) : to_acc(pb.v[i])));
    }
    store_pack(out + j, po);
  }
  for (int64_t j = head + packs * N + threadIdx.x; j < n; j += blockDim.x) {
    out[j] = from_acc<T>(fn(j, to_acc(a[j]), b == nullptr ? A(0) : to_acc(b[j])));
  }
}

// Threads of a block that owns rows of `cols` elements: one per 16-byte pack, rounded to
// whole warps, at most kMaxRowThreads.
template <class T>
int row_threads(int64_t cols) {
  const int64_t packs = (cols + 16 / sizeof(T) - 1) / (16 / sizeof(T));
  return static_cast<int>(std::clamp<int64_t>((packs + 31) / 32 * 32, 32, kMaxRowThreads));
}

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>(std::min(rows, kMaxGrid)); }

// Running maximum and sum of exp(v - max) of one thread's elements.
//
// Note [Infinite logits]
// An element equal to the running maximum adds exactly 1, even at -inf: a row whose
// elements so far are all -inf counts them, and they vanish (times exp(-inf) = 0) once a
// finite maximum arrives. A row of only -inf gets the sum NaN, and a +inf element makes the
// sum NaN, as the CPU's two passes (sum of exp(x - max)) do.
template <class A>
struct MaxSum {
  A max = A(-INFINITY);
  A sum = A(0);

  __device__ __forceinline__ void add(A v) {
    if (v > max) {
      sum *= exp_acc(max - v);
      max = v;
    }
    // A NaN v is never the maximum and adds NaN.
    sum += v != max ? exp_acc(v - max) : v == A(INFINITY) ? A(NAN) : A(1);
  }
};

// The block's maximum and its sum of exp(x - maximum) from every thread's MaxSum.
template <class A>
__device__ __forceinline__ MaxSum<A> block_max_sum(MaxSum<A> mine, A* scratch) {
  MaxSum<A> all;
  all.max = block_max(mine.max, scratch);
  const A scale = mine.max == all.max ? A(1) : exp_acc(mine.max - all.max);
  all.sum = block_sum(mine.sum * scale, scratch);
  if (all.max == A(-INFINITY)) all.sum = A(NAN);  // Note [Infinite logits]
  return all;
}

template <class T>
constexpr DType acc_dtype() {
  return std::is_same_v<acc_t<T>, double> ? DType::f64 : DType::f32;
}

// lse[r] = log(sum(exp(logits[r]))); row_loss[r] = lse[r] - logits[r, target[r]], or 0 for an
// ignored row or a bad target (Note [CUDA cross-entropy targets]).
template <class T, class I>
__global__ void cross_entropy_kernel(const T* __restrict__ logits,  // (rows, vocab), rows ld apart
                                     int64_t ld,
                                     const I* __restrict__ targets,  // (rows), target_stride apart
                                     int64_t target_stride, int64_t ignore_index, int64_t rows,
                                     int64_t vocab,
                                     acc_t<T>* __restrict__ lse,       // (rows)
                                     acc_t<T>* __restrict__ row_loss,  // (rows)
                                     unsigned long long* bad_row) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  const T* none = nullptr;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = logits + r * ld;
    MaxSum<A> mine;
    visit_row(xr, none, vocab, [&](int64_t, A v, A) { mine.add(v); });
    const MaxSum<A> all = block_max_sum(mine, scratch);
    if (threadIdx.x == 0) {
      const A l = all.max + log_acc(all.sum);
      const int64_t t = static_cast<int64_t>(targets[r * target_stride]);
      A loss = A(0);
      if (t != ignore_index) {
        if (t >= 0 && t < vocab) {
          loss = l - to_acc(xr[t]);
        } else {
          atomicMin(bad_row, static_cast<unsigned long long>(r));
        }
      }
      lse[r] = l;
      row_loss[r] = loss;
    }
  }
}

// loss = (sum of row_loss in f64) / (rows whose target is not ignore_index), 0 when none.
// One block: the sum's order depends on the row count only.
template <class A, class I>
__global__ void mean_loss_kernel(const A* __restrict__ row_loss,  // (rows)
                                 const I* __restrict__ targets,   // (rows), target_stride apart
                                 int64_t target_stride, int64_t ignore_index, int64_t rows,
                                 A* __restrict__ loss) {  // ()
  __shared__ double scratch_sum[32];
  __shared__ long long scratch_count[32];
  double total = 0.0;
  long long count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    total += static_cast<double>(row_loss[r]);
    count += static_cast<int64_t>(targets[r * target_stride]) != ignore_index ? 1 : 0;
  }
  total = block_sum(total, scratch_sum);
  count = block_sum(count, scratch_count);
  if (threadIdx.x == 0)
    *loss = static_cast<A>(count > 0 ? total / static_cast<double>(count) : 0.0);
}

// scale = dloss / (rows whose target is not ignore_index), 0 when none; in f64 as the CPU.
template <class D, class I>
__global__ void grad_scale_kernel(const D* __restrict__ dloss,    // (one element)
                                  const I* __restrict__ targets,  // (rows), target_stride apart
                                  int64_t target_stride, int64_t ignore_index, int64_t rows,
                                  double* __restrict__ scale) {  // ()
  __shared__ long long scratch[32];
  long long count = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    count += static_cast<int64_t>(targets[r * target_stride]) != ignore_index ? 1 : 0;
  }
  count = block_sum(count, scratch);
  if (threadIdx.x == 0) {
    *scale = count > 0 ? static_cast<double>(to_acc(*dloss)) / static_cast<double>(count) : 0.0;
  }
}

// dlogits[r] = (exp(logits[r] - lse[r]) - onehot(target[r])) * scale; zeros for an ignored
// row or a bad target (Note [CUDA cross-entropy targets]).
template <class T, class S, class I>
__global__ void cross_entropy_backward_kernel(
    const T* __restrict__ logits,  // (rows, vocab), rows ld apart
    int64_t ld,
    const I* __restrict__ targets,                     // (rows), target_stride apart
    int64_t target_stride, const S* __restrict__ lse,  // (rows)
    const double* __restrict__ scale,                  // ()
    int64_t ignore_index, int64_t rows, int64_t vocab,
    T* __restrict__ dlogits,  // (rows, vocab) dense
    unsigned long long* bad_row) {
  using A = acc_t<T>;
  const T* none = nullptr;
  const A s = static_cast<A>(*scale);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t t = static_cast<int64_t>(targets[r * target_stride]);
    T* dxr = dlogits + r * vocab;
    if (t == ignore_index || t < 0 || t >= vocab) {
      if (t != ignore_index && threadIdx.x == 0)
        atomicMin(bad_row, static_cast<unsigned long long>(r));
      for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) dxr[j] = from_acc<T>(A(0));
      continue;
    }
    const A l = to_acc(lse[r]);
    map_row(logits + r * ld, none, dxr, vocab, [&](int64_t j, A v, A) {
      const A g = exp_acc(v - l) * s;
      return j == t ? g - s : g;
    });
  }
}

// Logits whose rows are unit-strided are read in place with their row stride (the first V
// columns of padded (N, Vp) logits need no copy); any other layout is copied, as on the CPU.
Tensor row_readable(const Tensor& logits_in) {  // (N, V)
  const Tensor logits = logits_in.detach();
  const bool in_place = (logits.size(1) <= 1 || logits.stride(1) == 1) &&
                        (logits.size(0) <= 1 || logits.stride(0) >= logits.size(1));
  return in_place ? logits : logits.contiguous();
}

// Elements between the starts of consecutive rows.
int64_t row_stride(const Tensor& logits) {
  return logits.size(0) <= 1 ? logits.size(1) : logits.stride(0);
}

// Calls f(TypeTag<I>{}) with I the targets' element type (i32 or i64, as the wrapper checked).
template <class F>
void dispatch_targets(const char* op, const Tensor& targets, F&& f) {
  if (targets.dtype() == DType::i32) {
    f(TypeTag<int32_t>{});
    return;
  }
  TS_CHECK(targets.dtype() == DType::i64, "[", op, "] expected index dtype i32 or i64, found ",
           dtype_name(targets.dtype()));
  f(TypeTag<int64_t>{});
}

// A device word for the lowest bad row, set to kNoRow.
Tensor bad_row_word(const char* op, Device device) {
  Tensor word = empty({1}, {DType::i64, device});
  check_cuda(cudaMemsetAsync(word.raw_data(), 0xff, sizeof(unsigned long long), kStream), op,
             "cudaMemsetAsync");
  return word;
}

unsigned long long* word_ptr(const Tensor& word) {
  return static_cast<unsigned long long*>(word.raw_data());
}

// Reads the bad-row word back (waiting for the launches) and throws the CPU's message when a
// target was outside [0, vocab) and not ignore_index (Note [CUDA cross-entropy targets]).
void check_targets(const char* op, const Tensor& word, const Tensor& targets, int64_t vocab,
                   int64_t ignore_index) {
  unsigned long long row = kNoRow;
  check_cuda(cudaMemcpy(&row, word.raw_data(), sizeof(row), cudaMemcpyDeviceToHost), op,
             "cudaMemcpy");
  if (row == kNoRow) return;
  const int64_t r = static_cast<int64_t>(row);
  const int64_t found = targets.select(0, r).item<int64_t>();
  TS_FAIL("[", op, "] expected targets in [0, ", vocab, ") or ignore_index ", ignore_index,
          ", found ", found, " at row ", r);
}

}  // namespace

CrossEntropyOutput cross_entropy(const Tensor& logits_in, const Tensor& targets_in,
                                 int64_t ignore_index) {
  constexpr const char* op = "cross_entropy";
  const Tensor logits = row_readable(logits_in);  // (N, V), rows ld apart
  const Tensor targets = targets_in.detach();     // (N)
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  const int64_t ld = row_stride(logits);
  const int64_t target_stride = targets.stride(0);
  CrossEntropyOutput out;
  dispatch_cuda_floating(logits.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    // The loss and lse are f32 for half logits (acc_t), else in the logits' dtype.
    const TensorOptions acc_options{acc_dtype<T>(), logits.device()};
    out.lse = empty({rows}, acc_options);
    if (rows == 0) {
      out.loss = zeros({}, acc_options);  // the CPU's 0 when no row counts
      return;
    }
    out.loss = empty({}, acc_options);
    set_device(op, logits);
    const Tensor row_loss = empty({rows}, acc_options);  // (N)
    const Tensor bad = bad_row_word(op, logits.device());
    dispatch_targets(op, targets, [&](auto target_tag) {
      using I = typename decltype(target_tag)::type;
      cross_entropy_kernel<T, I><<<row_blocks(rows), row_threads<T>(vocab), 0, kStream>>>(
          ptr<T>(logits), ld, ptr<I>(targets), target_stride, ignore_index, rows, vocab,
          ptr<A>(out.lse), ptr<A>(row_loss), word_ptr(bad));
      check_launch(op);
      mean_loss_kernel<A, I><<<1, kCountThreads, 0, kStream>>>(
          ptr<A>(row_loss), ptr<I>(targets), target_stride, ignore_index, rows, ptr<A>(out.loss));
      check_launch(op);
    });
    check_targets(op, bad, targets, vocab, ignore_index);
  });
  return out;
}

Tensor cross_entropy_backward(const Tensor& dloss_in, const Tensor& logits_in,
                              const Tensor& targets_in, const Tensor& lse_in,
                              int64_t ignore_index) {
  constexpr const char* op = "cross_entropy_backward";
  const Tensor logits = row_readable(logits_in);    // (N, V), rows ld apart
  const Tensor targets = targets_in.detach();       // (N)
  const Tensor lse = lse_in.detach().contiguous();  // (N)
  const Tensor dloss = dloss_in.detach();           // one element
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  const int64_t ld = row_stride(logits);
  const int64_t target_stride = targets.stride(0);
  Tensor dlogits = empty({rows, vocab}, {logits.dtype(), logits.device()});  // (N, V) dense
  if (rows == 0) return dlogits;
  set_device(op, logits);
  const Tensor scale = empty({}, {DType::f64, logits.device()});  // ()
  const Tensor bad = bad_row_word(op, logits.device());
  dispatch_targets(op, targets, [&](auto target_tag) {
    using I = typename decltype(target_tag)::type;
    // dloss may be f32 while the logits are half: read in its own dtype.
    dispatch_cuda_floating(dloss.dtype(), op, [&](auto dloss_tag) {
      using D = typename decltype(dloss_tag)::type;
      grad_scale_kernel<D, I><<<1, kCountThreads, 0, kStream>>>(
          ptr<D>(dloss), ptr<I>(targets), target_stride, ignore_index, rows, ptr<double>(scale));
      check_launch(op);
    });
    dispatch_cuda_floating(logits.dtype(), op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      auto launch = [&](auto lse_tag) {
        using S = typename decltype(lse_tag)::type;
        cross_entropy_backward_kernel<T, S, I>
            <<<row_blocks(rows), row_threads<T>(vocab), 0, kStream>>>(
                ptr<T>(logits), ld, ptr<I>(targets), target_stride, ptr<S>(lse), ptr<double>(scale),
                ignore_index, rows, vocab, ptr<T>(dlogits), word_ptr(bad));
        check_launch(op);
      };
      // lse as cross_entropy saves it on CUDA (acc_t), or in the logits' dtype.
      if (lse.dtype() == logits.dtype()) {
        launch(TypeTag<T>{});
      } else {
        TS_CHECK(lse.dtype() == acc_dtype<T>(), "[", op, "] expected lse of dtype ",
                 dtype_name(logits.dtype()), " or ", dtype_name(acc_dtype<T>()), ", found ",
                 dtype_name(lse.dtype()));
        launch(TypeTag<acc_t<T>>{});
      }
    });
  });
  check_targets(op, bad, targets, vocab, ignore_index);
  return dlogits;
}

}  // namespace tessera::kernels::cuda
