// CUDA fused softmax cross-entropy: per-row log-sum-exp and loss without materializing
// probabilities, a fixed-order mean over rows, and the fused backward.
//
// The row kernels follow Note [Row kernels] in kernels/cuda/rows.cuh.
//
// Note [CUDA cross-entropy targets]
// The CPU throws on a target outside [0, V) that is not ignore_index. Here the row kernels
// never index the logits with such a target: they record the lowest such row as a deferred
// check (Note [Deferred device checks], core/cuda_runtime.h; atomicMin, so the row is the
// CPU's first), and the next synchronizing read throws the CPU's message. No call waits.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/rows.cuh"

namespace tessera::kernels::cuda {
namespace {

using namespace rows;  // NOLINT: this file's own helpers, see rows.cuh

constexpr int kCountThreads = 1024;  // the single block that reduces over rows

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
                                     unsigned long long* check_word, uint64_t check_tag) {
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
          atomicMin(check_word, check_tag | static_cast<unsigned long long>(r));
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

// dlogits[r, :vocab] = (exp(logits[r] - lse[r]) - onehot(target[r])) * scale, zeros for an
// ignored row or a bad target (Note [CUDA cross-entropy targets]); dlogits[r, vocab:cols]
// = 0, the padding columns of a padded vocabulary.
template <class T, class S, class I>
__global__ void cross_entropy_backward_kernel(
    const T* __restrict__ logits,  // (rows, vocab), rows ld apart
    int64_t ld,
    const I* __restrict__ targets,                     // (rows), target_stride apart
    int64_t target_stride, const S* __restrict__ lse,  // (rows)
    const double* __restrict__ scale,                  // ()
    int64_t ignore_index, int64_t rows, int64_t vocab, int64_t cols,
    T* __restrict__ dlogits,  // (rows, cols) dense
    unsigned long long* check_word, uint64_t check_tag) {
  using A = acc_t<T>;
  const T* none = nullptr;
  const A s = static_cast<A>(*scale);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t t = static_cast<int64_t>(targets[r * target_stride]);
    T* dxr = dlogits + r * cols;
    for (int64_t j = vocab + threadIdx.x; j < cols; j += blockDim.x) dxr[j] = from_acc<T>(A(0));
    if (t == ignore_index || t < 0 || t >= vocab) {
      if (t != ignore_index && threadIdx.x == 0) {
        atomicMin(check_word, check_tag | static_cast<unsigned long long>(r));
      }
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

// Registers the targets check of `op` (Note [CUDA cross-entropy targets]): the first row
// whose target is outside [0, vocab) and not ignore_index fails with the CPU's message.
uint64_t defer_targets_check(const char* op, const Tensor& targets, int64_t vocab,
                             int64_t ignore_index) {
  return ::tessera::cuda::defer_check(targets.device().index, [op = std::string(op), targets, vocab,
                                                               ignore_index](int64_t r) {
    return str_cat("[", op, "] expected targets in [0, ", vocab, ") or ignore_index ", ignore_index,
                   ", found ", targets.select(0, r).item<int64_t>(), " at row ", r);
  });
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
    const uint64_t check_tag = defer_targets_check(op, targets, vocab, ignore_index);
    unsigned long long* word = ::tessera::cuda::deferred_check_word(logits.device().index);
    dispatch_targets(op, targets, [&](auto target_tag) {
      using I = typename decltype(target_tag)::type;
      cross_entropy_kernel<T, I><<<row_blocks(rows), row_threads<T>(vocab), 0, kStream>>>(
          ptr<T>(logits), ld, ptr<I>(targets), target_stride, ignore_index, rows, vocab,
          ptr<A>(out.lse), ptr<A>(row_loss), word, check_tag);
      check_launch(op);
      mean_loss_kernel<A, I><<<1, kCountThreads, 0, kStream>>>(
          ptr<A>(row_loss), ptr<I>(targets), target_stride, ignore_index, rows, ptr<A>(out.loss));
      check_launch(op);
    });
  });
  return out;
}

Tensor cross_entropy_backward(const Tensor& dloss_in, const Tensor& logits_in,
                              const Tensor& targets_in, const Tensor& lse_in, int64_t ignore_index,
                              int64_t cols) {
  constexpr const char* op = "cross_entropy_backward";
  const Tensor logits = row_readable(logits_in);    // (N, V), rows ld apart
  const Tensor targets = targets_in.detach();       // (N)
  const Tensor lse = lse_in.detach().contiguous();  // (N)
  const Tensor dloss = dloss_in.detach();           // one element
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  const int64_t ld = row_stride(logits);
  const int64_t target_stride = targets.stride(0);
  Tensor dlogits = empty({rows, cols}, {logits.dtype(), logits.device()});  // (N, cols) dense
  if (rows == 0) return dlogits;
  set_device(op, logits);
  const Tensor scale = empty({}, {DType::f64, logits.device()});  // ()
  const uint64_t check_tag = defer_targets_check(op, targets, vocab, ignore_index);
  unsigned long long* word = ::tessera::cuda::deferred_check_word(logits.device().index);
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
                ignore_index, rows, vocab, cols, ptr<T>(dlogits), word, check_tag);
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
  return dlogits;
}

}  // namespace tessera::kernels::cuda
