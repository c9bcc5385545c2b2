#include "kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dispatch.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "kernels/cpu/eigen_types.h"
#include "kernels/cpu/widen.h"

namespace tessera::kernels::cpu {
namespace {

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

int64_t count_rows(const std::vector<int64_t>& targets, int64_t ignore_index) {
  return std::count_if(targets.begin(), targets.end(),
                       [&](int64_t t) { return t != ignore_index; });
}

}  // namespace

CrossEntropyOutput cross_entropy(const Tensor& logits_in, const Tensor& targets_in,
                                 int64_t ignore_index) {
  // Loss and lse are f32 for 16-bit logits (stat_dtype): nothing to round back.
  if (is_half(logits_in.dtype()))
    return cpu::cross_entropy(widened(logits_in), targets_in, ignore_index);
  const Tensor logits = row_readable(logits_in);  // (N, V), rows ld apart
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  const int64_t ld = row_stride(logits);
  const std::vector<int64_t> targets =
      read_targets("cross_entropy", targets_in, vocab, ignore_index);
  const int64_t count = count_rows(targets, ignore_index);
  CrossEntropyOutput out;
  out.lse = empty({rows}, {logits.dtype(), logits.device()});
  // Per-row losses summed in order afterwards: the loss does not depend on thread timing.
  std::vector<double> row_loss(static_cast<size_t>(rows), 0.0);
  dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = logits.data_ptr<T>();
    T* plse = out.lse.data_ptr<T>();
    parallel_for(rows, row_grain(vocab), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const ConstArrayMap<T> xr(px + r * ld, vocab);
        const T max = xr.maxCoeff();
        const T lse = max + std::log((xr - max).exp().sum());
        plse[r] = lse;
        if (targets[r] != ignore_index) row_loss[r] = lse - xr[targets[r]];
      }
    });
  });
  double total = 0.0;
  for (double l : row_loss) total += l;
  out.loss = scalar_tensor(count > 0 ? total / count : 0.0, {logits.dtype(), logits.device()});
  return out;
}

Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits_in,
                              const Tensor& targets_in, const Tensor& lse_in, int64_t ignore_index,
                              int64_t cols) {
  if (is_half(logits_in.dtype())) {
    return narrowed(cpu::cross_entropy_backward(dloss, widened(logits_in), targets_in, lse_in,
                                                ignore_index, cols),
                    logits_in.dtype());
  }
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
  dispatch_floating(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = logits.data_ptr<T>();
    const T* plse = lse.data_ptr<T>();
    T* pdx = dlogits.data_ptr<T>();
    const T s = static_cast<T>(scale);
    parallel_for(rows, row_grain(vocab), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        ArrayMap<T> dxr(pdx + r * cols, vocab);
        std::fill(pdx + r * cols + vocab, pdx + (r + 1) * cols, T(0));
        if (targets[r] == ignore_index) {
          dxr.setZero();
          continue;
        }
        dxr = (ConstArrayMap<T>(px + r * ld, vocab) - plse[r]).exp() * s;
        dxr[targets[r]] -= s;
      }
    });
  });
  return dlogits;
}

}  // namespace tessera::kernels::cpu
