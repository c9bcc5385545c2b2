// CPU concatenation and indexed gather/scatter along one dim.
//
// x is viewed as a contiguous (outer, n, inner) block around `dim`: a gather copies rows
// of `inner` elements as bytes (any dtype), a scatter-add adds them.
#include "kernels/cpu/index.h"

#include <algorithm>
#include <cstring>

#include "core/dispatch.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "core/parallel.h"
#include "kernels/cpu/index_range.h"
#include "kernels/cpu/widen.h"

namespace tessera::kernels::cpu {
namespace {

constexpr int64_t kGrain = 32768;  // elements per parallel task
constexpr int64_t kColumns = 256;  // columns one scatter-add task owns

int64_t product(const Shape& shape, int64_t begin, int64_t end) {
  int64_t n = 1;
  for (int64_t d = begin; d < end; ++d) n *= shape[d];
  return n;
}

}  // namespace

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {  // (..., n_i, ...) -> (..., sum n_i, ...)
  Shape shape = xs.front().shape();
  shape[dim] = 0;
  for (const Tensor& x : xs) shape[dim] += x.size(dim);
  Tensor out = empty(shape, {xs.front().dtype(), xs.front().device()});
  NoGradGuard no_grad;  // raw views of the output (Note [Raw views and autograd])
  int64_t start = 0;
  for (const Tensor& x : xs) {
    out.narrow(dim, start, x.size(dim)).copy_(x);
    start += x.size(dim);
  }
  return out;
}

Tensor index_select(const Tensor& x, int64_t dim,
                    const Tensor& index) {  // (..., n, ...), (L) -> (..., L, ...)
  const Tensor src = x.detach().contiguous();
  const Tensor idx = index.detach().contiguous();
  const Shape& shape = src.shape();
  const int64_t outer = product(shape, 0, dim);
  const int64_t n = shape[dim];
  const int64_t inner = product(shape, dim + 1, src.dim());
  const int64_t count = idx.numel();
  Shape out_shape = shape;
  out_shape[dim] = count;
  Tensor out = empty(out_shape, {src.dtype(), src.device()});
  const int64_t row_bytes = inner * static_cast<int64_t>(src.itemsize());
  const char* from = static_cast<const char*>(src.raw_data());
  char* to = static_cast<char*>(out.raw_data());
  dispatch_index(idx.dtype(), "index_select", [&](auto tag) {
    using I = typename decltype(tag)::type;
    const I* ip = idx.data_ptr<I>();
    check_index_range("index_select", "index", ip, count, n, idx.shape());
    parallel_for(outer * count, std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1)),
                 [&](int64_t t0, int64_t t1) {
                   for (int64_t t = t0; t < t1; ++t) {
                     const int64_t o = t / count;
                     const int64_t row = o * n + static_cast<int64_t>(ip[t % count]);
                     std::memcpy(to + t * row_bytes, from + row * row_bytes, row_bytes);
                   }
                 });
  });
  return out;
}

void index_add_(const Tensor& out, int64_t dim, const Tensor& index,
                const Tensor& src) {  // (..., n, ...), (L), (..., L, ...)
  if (is_half(out.dtype())) {
    update_widened(out, [&](const Tensor& wide) { index_add_(wide, dim, index, widened(src)); });
    return;
  }
  // Accumulate into out directly when it is contiguous, else into a copy written back.
  const bool in_place = out.is_contiguous();
  const Tensor target = in_place ? out.detach() : out.detach().contiguous();
  const Tensor s = src.detach().contiguous();
  const Tensor idx = index.detach().contiguous();
  const int64_t outer = product(target.shape(), 0, dim);
  const int64_t n = target.size(dim);
  const int64_t inner = product(target.shape(), dim + 1, target.dim());
  const int64_t count = idx.numel();
  dispatch_index(idx.dtype(), "index_add_", [&](auto itag) {
    using I = typename decltype(itag)::type;
    const I* ip = idx.data_ptr<I>();
    check_index_range("index_add_", "index", ip, count, n, idx.shape());
    dispatch_floating(target.dtype(), "index_add_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* dst = target.data_ptr<T>();
      const T* from = s.data_ptr<T>();
      // Tasks own disjoint (outer, column block) pieces, so duplicate indices never race
      // and each element accumulates in index order.
      const int64_t blocks = (inner + kColumns - 1) / kColumns;
      const int64_t grain =
          std::max<int64_t>(1, kGrain / std::max<int64_t>(count * std::min(inner, kColumns), 1));
      parallel_for(outer * blocks, grain, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t o = t / blocks;
          const int64_t c0 = (t % blocks) * kColumns;
          const int64_t width = std::min(kColumns, inner - c0);
          for (int64_t i = 0; i < count; ++i) {
            T* d = dst + (o * n + static_cast<int64_t>(ip[i])) * inner + c0;
            const T* f = from + (o * count + i) * inner + c0;
            for (int64_t j = 0; j < width; ++j) d[j] += f[j];
          }
        }
      });
    });
  });
  if (!in_place) out.copy_(target);
}

}  // namespace tessera::kernels::cpu
