// CPU embedding: rows of the weight gathered by id, and their gradient scattered back.
#include "kernels/cpu/embedding.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/dispatch.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "kernels/cpu/index_range.h"
#include "kernels/cpu/widen.h"

namespace tessera::kernels::cpu {
namespace {

constexpr int64_t kGrain = 32768;  // elements per parallel task

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) {  // (V, C), (...) -> (..., C)
  const Tensor w = weight.detach().contiguous();
  const Tensor id = ids.detach().contiguous();
  const int64_t vocab = w.size(0);
  const int64_t channels = w.size(1);
  const int64_t count = id.numel();
  Shape shape = id.shape();
  shape.push_back(channels);
  Tensor out = empty(shape, {w.dtype(), w.device()});
  const int64_t row_bytes = channels * static_cast<int64_t>(w.itemsize());
  const char* from = static_cast<const char*>(w.raw_data());
  char* to = static_cast<char*>(out.raw_data());
  dispatch_index(id.dtype(), "embedding", [&](auto tag) {
    using I = typename decltype(tag)::type;
    const I* ip = id.data_ptr<I>();
    check_index_range("embedding", "ids", ip, count, vocab, id.shape());
    parallel_for(count, std::max<int64_t>(1, kGrain / std::max<int64_t>(channels, 1)),
                 [&](int64_t n0, int64_t n1) {
                   for (int64_t n = n0; n < n1; ++n) {
                     std::memcpy(to + n * row_bytes, from + static_cast<int64_t>(ip[n]) * row_bytes,
                                 row_bytes);
                   }
                 });
  });
  return out;
}

namespace {

// dweight (V, C) += the sums of grad's rows by id, each summed in position order first.
void add_rows_by_id(const char* op, const Tensor& dweight, const Tensor& grad, const Tensor& ids) {
  const Tensor g = grad.detach().contiguous();
  const Tensor id = ids.detach().contiguous();
  const int64_t channels = g.size(-1);
  const int64_t count = id.numel();
  dispatch_index(id.dtype(), op, [&](auto itag) {
    using I = typename decltype(itag)::type;
    const I* ip = id.data_ptr<I>();
    check_index_range(op, "ids", ip, count, dweight.size(0), id.shape());
    // Positions in id order, equal ids in position order; runs[r] .. runs[r + 1] is the r-th
    // run of one id. Each task sums whole runs, so no two touch the same row.
    std::vector<int64_t> order(count);
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [ip](int64_t a, int64_t b) { return ip[a] < ip[b]; });
    std::vector<int64_t> runs;
    for (int64_t i = 0; i < count; ++i) {
      if (i == 0 || ip[order[i]] != ip[order[i - 1]]) runs.push_back(i);
    }
    runs.push_back(count);
    dispatch_floating_and_half(g.dtype(), op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using A = acc_t<T>;  // 16-bit rows are summed in f32 and added with one rounding
      const T* gp = g.data_ptr<T>();
      T* dw = dweight.data_ptr<T>();
      const auto num_runs = static_cast<int64_t>(runs.size()) - 1;
      parallel_for(num_runs, std::max<int64_t>(1, kGrain / std::max<int64_t>(channels, 1)),
                   [&](int64_t r0, int64_t r1) {
                     std::vector<A> sum(channels);
                     for (int64_t r = r0; r < r1; ++r) {
                       // The run's rows summed in position order, then added.
                       const T* first = gp + order[runs[r]] * channels;
                       for (int64_t c = 0; c < channels; ++c) sum[c] = convert<A>(first[c]);
                       for (int64_t n = runs[r] + 1; n < runs[r + 1]; ++n) {
                         const T* s = gp + order[n] * channels;
#pragma omp simd
                         for (int64_t c = 0; c < channels; ++c) sum[c] += convert<A>(s[c]);
                       }
                       T* d = dw + static_cast<int64_t>(ip[order[runs[r]]]) * channels;
#pragma omp simd
                       for (int64_t c = 0; c < channels; ++c) {
                         d[c] = convert<T>(convert<A>(d[c]) + sum[c]);
                       }
                     }
                   });
    });
  });
}

}  // namespace

Tensor embedding_backward(const Tensor& grad, const Tensor& ids,
                          int64_t num_embeddings) {  // (..., C), (...) -> (V, C)
  // Zeros plus the rows' sums: bitwise the sums themselves (0 + x = x).
  Tensor dweight = zeros({num_embeddings, grad.size(-1)}, {grad.dtype(), grad.device()});
  add_rows_by_id("embedding_backward", dweight, grad, ids);
  return dweight;
}

void embedding_backward_add_(const Tensor& dweight, const Tensor& grad,
                             const Tensor& ids) {  // (V, C) += (..., C) by (...)
  add_rows_by_id("embedding_backward_add_", dweight, grad, ids);
}

}  // namespace tessera::kernels::cpu
