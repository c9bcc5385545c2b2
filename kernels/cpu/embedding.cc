// CPU embedding: rows of the weight gathered by id, and their gradient scattered back.
#include "kernels/cpu/embedding.h"

#include <algorithm>
#include <cstring>

#include "core/dispatch.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "kernels/cpu/index_range.h"

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

Tensor embedding_backward(const Tensor& grad, const Tensor& ids,
                          int64_t num_embeddings) {  // (..., C), (...) -> (V, C)
  const Tensor g = grad.detach().contiguous();
  const Tensor id = ids.detach().contiguous();
  const int64_t channels = g.size(-1);
  const int64_t count = id.numel();
  Tensor dweight = empty({num_embeddings, channels}, {g.dtype(), g.device()});
  dispatch_index(id.dtype(), "embedding_backward", [&](auto itag) {
    using I = typename decltype(itag)::type;
    const I* ip = id.data_ptr<I>();
    check_index_range("embedding_backward", "ids", ip, count, num_embeddings, id.shape());
    dispatch_floating(g.dtype(), "embedding_backward", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* gp = g.data_ptr<T>();
      T* dw = dweight.data_ptr<T>();
      // Each task owns a range of vocabulary rows: it zeroes them, then adds the gradient
      // rows whose id falls in its range, in id order. Repeated ids never race and the
      // sums do not depend on the thread count.
      parallel_for(num_embeddings, std::max<int64_t>(1, kGrain / std::max<int64_t>(channels, 1)),
                   [&](int64_t v0, int64_t v1) {
                     std::fill(dw + v0 * channels, dw + v1 * channels, T(0));
                     for (int64_t n = 0; n < count; ++n) {
                       const int64_t v = static_cast<int64_t>(ip[n]);
                       if (v < v0 || v >= v1) continue;
                       T* d = dw + v * channels;
                       const T* s = gp + n * channels;
#pragma omp simd
                       for (int64_t c = 0; c < channels; ++c) d[c] += s[c];
                     }
                   });
    });
  });
  return dweight;
}

}  // namespace tessera::kernels::cpu
