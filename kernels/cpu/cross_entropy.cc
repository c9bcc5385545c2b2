#include "kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/dispatch.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "kernels/checks.h"
#include "kernels/cpu/eigen_types.h"
#include "kernels/cpu/widen.h"

namespace tessera::kernels::cpu {
namespace {

// A 16-bit row's f32 values, aligned to Eigen's largest packet (EIGEN_MAX_ALIGN_BYTES), so
// that its exp takes the same path for every element whatever the heap hands out (Note
// [Aligned scratch] in widen.h).
template <class A>
using RowBuffer = std::vector<A, Eigen::aligned_allocator<A>>;

// Rows per parallel_for chunk, so that each chunk touches at least ~32K elements.
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, 32768 / cols); }

// The targets as int64, each checked to be in [0, V) or ignore_index.
std::vector<int64_t> read_targets(const char* op, const Tensor& targets_in, int64_t vocab,
                                  int64_t ignore_index) {  // (N) i32|i64
  const Tensor targets = targets_in.detach().contiguous();
  std::vector<int64_t> out(static_cast<size_t>(targets.numel()));
  dispatch_index(targets.dtype(), op, [&](auto tag) {
    using I = typename decltype(tag)::type;
    const I* p = targets.data_ptr<I>();
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = p[i];
      TS_CHECK(out[i] == ignore_index || (out[i] >= 0 && out[i] < vocab), "[", op,
               "] expected targets in [0, ", vocab, ") or ignore_index ", ignore_index, ", found ",
               out[i], " at row ", i);
    }
  });
  return out;
}

// Logits whose rows are unit-strided are read in place with their row stride (the first V
// columns of padded (N, Vp) logits need no copy); any other layout is copied.
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

// A row of n logits as acc_t<T> values: the row itself for f32 and f64, its values widened
// into `buffer` for f16 and bf16 (Note [16-bit math on the CPU]).
template <class T>
const acc_t<T>* row_values(const T* row, int64_t n, RowBuffer<acc_t<T>>& buffer) {
  if constexpr (!kIsHalf<T>) {
    return row;
  } else {
    buffer.resize(static_cast<size_t>(n));
    load_floats<T>(reinterpret_cast<const char*>(row), sizeof(T), n, buffer.data());
    return buffer.data();
  }
}

// Where a row of n results is computed: the output row itself for f32 and f64, `buffer`
// for f16 and bf16 (stored rounded afterwards).
template <class T>
acc_t<T>* out_row(T* row, int64_t n, RowBuffer<acc_t<T>>& buffer) {
  if constexpr (!kIsHalf<T>) {
    return row;
  } else {
    buffer.resize(static_cast<size_t>(n));
    return buffer.data();
  }
}

int64_t count_rows(const std::vector<int64_t>& targets, int64_t ignore_index) {
  return std::count_if(targets.begin(), targets.end(),
                       [&](int64_t t) { return t != ignore_index; });
}

}  // namespace

CrossEntropyOutput cross_entropy(const Tensor& logits_in, const Tensor& targets_in,
                                 int64_t ignore_index) {
  const Tensor logits = row_readable(logits_in);  // (N, V), rows ld apart
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  const int64_t ld = row_stride(logits);
  const std::vector<int64_t> targets =
      read_targets("cross_entropy", targets_in, vocab, ignore_index);
  const int64_t count = count_rows(targets, ignore_index);
  // Loss and lse in stat_dtype: f32 for 16-bit logits.
  const DType stat = stat_dtype(logits.dtype());
  CrossEntropyOutput out;
  out.lse = empty({rows}, {stat, logits.device()});
  // Per-row losses summed in order afterwards: the loss does not depend on thread timing.
  std::vector<double> row_loss(static_cast<size_t>(rows), 0.0);
  dispatch_floating_and_half(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* px = logits.data_ptr<T>();
    A* plse = out.lse.data_ptr<A>();
    parallel_for(rows, row_grain(vocab), [&](int64_t r0, int64_t r1) {
      RowBuffer<A> buffer;
      for (int64_t r = r0; r < r1; ++r) {
        const ConstArrayMap<A> xr(row_values(px + r * ld, vocab, buffer), vocab);
        const A max = xr.maxCoeff();
        const A lse = max + std::log((xr - max).exp().sum());
        plse[r] = lse;
        if (targets[r] != ignore_index) row_loss[r] = lse - xr[targets[r]];
      }
    });
  });
  double total = 0.0;
  for (double l : row_loss) total += l;
  out.loss = scalar_tensor(count > 0 ? total / count : 0.0, {stat, logits.device()});
  return out;
}

Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits_in,
                              const Tensor& targets_in, const Tensor& lse_in, int64_t ignore_index,
                              int64_t cols) {
  const Tensor logits = row_readable(logits_in);    // (N, V), rows ld apart
  const Tensor lse = lse_in.detach().contiguous();  // (N)
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  const int64_t ld = row_stride(logits);
  const std::vector<int64_t> targets =
      read_targets("cross_entropy_backward", targets_in, vocab, ignore_index);
  const int64_t count = count_rows(targets, ignore_index);
  const double scale = count > 0 ? dloss.item<double>() / count : 0.0;
  Tensor dlogits = empty({rows, cols}, {logits.dtype(), logits.device()});  // (N, cols)
  dispatch_floating_and_half(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const T* px = logits.data_ptr<T>();
    const A* plse = lse.data_ptr<A>();
    T* pdx = dlogits.data_ptr<T>();
    const A s = static_cast<A>(scale);
    parallel_for(rows, row_grain(vocab), [&](int64_t r0, int64_t r1) {
      RowBuffer<A> buffer, drow;  // 16-bit rows: the logits and dlogits in f32
      for (int64_t r = r0; r < r1; ++r) {
        T* out = pdx + r * cols;
        std::fill(out + vocab, out + cols, convert<T>(0.0));
        if (targets[r] == ignore_index) {
          std::fill(out, out + vocab, convert<T>(0.0));
          continue;
        }
        A* d = out_row<T>(out, vocab, drow);
        ArrayMap<A> dxr(d, vocab);
        dxr = (ConstArrayMap<A>(row_values(px + r * ld, vocab, buffer), vocab) - plse[r]).exp() * s;
        dxr[targets[r]] -= s;
        if constexpr (kIsHalf<T>) store_floats<T>(d, vocab, out);
      }
    });
  });
  return dlogits;
}

}  // namespace tessera::kernels::cpu
