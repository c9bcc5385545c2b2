// CUDA concatenation and indexed gather/scatter along one dim.
//
// As on the CPU, a contiguous tensor is viewed as (outer, n, inner) around `dim`. cat and
// index_select move rows as raw words (any dtype, 16 bytes at a time when sizes and
// addresses allow); index_add_ adds rows in a fixed order (Note [Deterministic
// index_add_]).
#include <algorithm>
#include <bit>
#include <climits>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <initializer_list>

#include "core/factories.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gather.cuh"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels::cuda {
namespace {

using namespace gather;  // NOLINT: this file's own helpers, see gather.cuh

int64_t product(const Shape& shape, int64_t begin, int64_t end) {
  int64_t n = 1;
  for (int64_t d = begin; d < end; ++d) n *= shape[d];
  return n;
}

uint64_t address(const void* p) { return reinterpret_cast<uint64_t>(p); }

// Row loops of the 2-D launch of row_launch (gather.cuh), grid-stride in both directions.
#define TS_FOR_ROWS(r, rows)                                                   \
  for (int64_t r = blockIdx.x * int64_t{blockDim.y} + threadIdx.y; r < (rows); \
       r += int64_t{gridDim.x} * blockDim.y)
#define TS_FOR_COLUMNS(c, width)                                                \
  for (int64_t c = blockIdx.y * int64_t{blockDim.x} + threadIdx.x; c < (width); \
       c += int64_t{gridDim.y} * blockDim.x)

// dst row r (rows dst_stride words apart) = src row r (contiguous rows of `width` words).
template <class U>
__global__ void copy_rows_kernel(U* __restrict__ dst, const U* __restrict__ src, int64_t rows,
                                 int64_t width, int64_t dst_stride) {
  TS_FOR_ROWS(r, rows) {
    const U* from = src + r * width;
    U* to = dst + r * dst_stride;
    TS_FOR_COLUMNS(c, width) { to[c] = from[c]; }
  }
}

// As copy_rows_kernel for a strided source: element e of src (row-major, read through
// ix) lands in row e / width, column e % width of dst. U is one element.
template <class U>
__global__ void copy_strided_kernel(U* __restrict__ dst, const U* __restrict__ src, Indexer ix,
                                    int64_t n, int64_t width, int64_t dst_stride) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / width;
    dst[r * dst_stride + (e - r * width)] = src[ix(e)];
  }
}

// out row (o, i) = src row (o, index[i]), rows of `width` words; an index outside [0, n)
// (failing the next read, Note [Deferred device checks]) gives a zero row, not a wild read.
template <class U, class I>
__global__ void gather_rows_kernel(U* __restrict__ out, const U* __restrict__ src,
                                   const I* __restrict__ index, int64_t outer, int64_t count,
                                   int64_t n, int64_t width) {
  TS_FOR_ROWS(r, outer * count) {
    const int64_t o = r / count;
    const int64_t v = static_cast<int64_t>(index[r - o * count]);
    const bool valid = v >= 0 && v < n;
    const U* from = src + (o * n + (valid ? v : 0)) * width;
    U* to = out + r * width;
    TS_FOR_COLUMNS(c, width) { to[c] = valid ? from[c] : U{}; }
  }
}

// Note [Deterministic index_add_]
// The (index, i) pairs are radix-sorted, stably, so equal indices keep i order. Row
// (o, k) of the launch is the k-th sorted pair of slice o; only the first pair of a run of
// equal indices does work: it adds the run's src rows, in i order and in acc_t, to the
// out row once. No two threads touch one out element, and for f32/f64 the additions are
// the CPU kernel's, bit for bit.
template <class T, class I, class P>
__global__ void index_add_kernel(T* __restrict__ out, const T* __restrict__ src,
                                 const I* __restrict__ keys, const P* __restrict__ pos,
                                 int64_t outer, int64_t n, int64_t count, int64_t inner) {
  using A = acc_t<T>;
  TS_FOR_ROWS(r, outer * count) {
    const int64_t o = r / count;
    const int64_t k = r - o * count;
    const I j = keys[k];
    if ((k > 0 && keys[k - 1] == j) || j < 0 || j >= n) continue;
    int64_t stop = k + 1;
    while (stop < count && keys[stop] == j) ++stop;
    T* to = out + (o * n + j) * inner;
    const T* from = src + o * count * inner;
    TS_FOR_COLUMNS(c, inner) {
      A acc = to_acc(to[c]);
      int64_t m = k;
      // Four loads in flight before their adds; the add order is unchanged.
      for (; m + 4 <= stop; m += 4) {
        const A a0 = to_acc(from[static_cast<int64_t>(pos[m]) * inner + c]);
        const A a1 = to_acc(from[static_cast<int64_t>(pos[m + 1]) * inner + c]);
        const A a2 = to_acc(from[static_cast<int64_t>(pos[m + 2]) * inner + c]);
        const A a3 = to_acc(from[static_cast<int64_t>(pos[m + 3]) * inner + c]);
        acc += a0;
        acc += a1;
        acc += a2;
        acc += a3;
      }
      for (; m < stop; ++m) acc += to_acc(from[static_cast<int64_t>(pos[m]) * inner + c]);
      to[c] = from_acc<T>(acc);
    }
  }
}

#undef TS_FOR_ROWS
#undef TS_FOR_COLUMNS

}  // namespace

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {  // (..., n_i, ...) -> (..., sum n_i, ...)
  const char* op = "cat";
  Shape shape = xs.front().shape();
  shape[dim] = 0;
  for (const Tensor& x : xs) shape[dim] += x.size(dim);
  Tensor out = empty(shape, {xs.front().dtype(), xs.front().device()});
  if (out.numel() == 0) return out;
  set_device(op, out);
  const int64_t outer = product(shape, 0, dim);
  const int64_t inner = product(shape, dim + 1, static_cast<int64_t>(shape.size()));
  const int64_t itemsize = static_cast<int64_t>(out.itemsize());
  const int64_t out_row = shape[dim] * inner;  // elements between out's rows
  int64_t start = 0;
  for (const Tensor& input : xs) {
    // A strided input deeper than an Indexer reaches is made contiguous first.
    const Tensor x = input.dim() > kMaxDims ? input.detach().contiguous() : input.detach();
    const int64_t piece = x.size(dim) * inner;  // elements of one row of x
    char* to = static_cast<char*>(out.raw_data()) + start * inner * itemsize;
    start += x.size(dim);
    if (piece == 0) continue;
    if (x.is_contiguous()) {
      const int unit = copy_unit({static_cast<uint64_t>(piece * itemsize),
                                  static_cast<uint64_t>(out_row * itemsize), address(to),
                                  address(x.raw_data())});
      dispatch_unit(unit, [&](auto utag) {
        using U = typename decltype(utag)::type;
        const int64_t width = piece * itemsize / static_cast<int64_t>(sizeof(U));
        const int64_t stride = out_row * itemsize / static_cast<int64_t>(sizeof(U));
        const RowLaunch launch = row_launch(outer, width);
        copy_rows_kernel<U><<<launch.grid, launch.block, 0, kStream>>>(
            reinterpret_cast<U*>(to), ptr<U>(x), outer, width, stride);
        check_launch(op);
      });
    } else {
      const Indexer ix = make_indexer(op, x, x.shape());
      dispatch_unit(static_cast<int>(itemsize), [&](auto utag) {
        using U = typename decltype(utag)::type;
        copy_strided_kernel<U><<<grid_for(x.numel()), kThreads, 0, kStream>>>(
            reinterpret_cast<U*>(to), ptr<U>(x), ix, x.numel(), piece, out_row);
        check_launch(op);
      });
    }
  }
  return out;
}

Tensor index_select(const Tensor& x, int64_t dim,
                    const Tensor& index) {  // (..., n, ...), (L) -> (..., L, ...)
  const char* op = "index_select";
  const Tensor src = x.detach().contiguous();
  const Tensor idx = index.detach().contiguous();
  const Shape& shape = src.shape();
  const int64_t outer = product(shape, 0, dim);
  const int64_t n = shape[dim];
  const int64_t inner = product(shape, dim + 1, src.dim());
  const int64_t count = idx.numel();
  Shape out_shape = shape;
  out_shape[dim] = count;
  set_device(op, src);
  Tensor out = empty(out_shape, {src.dtype(), src.device()});
  dispatch_ids(idx.dtype(), op, "an index", [&](auto itag) {
    using I = typename decltype(itag)::type;
    check_range<I>(op, "index", idx, n);
    if (out.numel() == 0) return;
    const int64_t row_bytes = inner * static_cast<int64_t>(src.itemsize());
    const int unit = copy_unit(
        {static_cast<uint64_t>(row_bytes), address(src.raw_data()), address(out.raw_data())});
    dispatch_unit(unit, [&](auto utag) {
      using U = typename decltype(utag)::type;
      const int64_t width = row_bytes / static_cast<int64_t>(sizeof(U));
      const RowLaunch launch = row_launch(outer * count, width);
      gather_rows_kernel<U, I><<<launch.grid, launch.block, 0, kStream>>>(
          ptr<U>(out), ptr<U>(src), ptr<I>(idx), outer, count, n, width);
      check_launch(op);
    });
  });
  return out;
}

void index_add_(const Tensor& out, int64_t dim, const Tensor& index,
                const Tensor& src) {  // (..., n, ...), (L), (..., L, ...)
  const char* op = "index_add_";
  // Accumulate into out directly when it is contiguous, else into a copy written back.
  const bool in_place = out.is_contiguous();
  const Tensor target = in_place ? out.detach() : out.detach().contiguous();
  const Tensor s = src.detach().contiguous();
  const Tensor idx = index.detach().contiguous();
  const int64_t outer = product(target.shape(), 0, dim);
  const int64_t n = target.size(dim);
  const int64_t inner = product(target.shape(), dim + 1, target.dim());
  const int64_t count = idx.numel();
  const Device device = target.device();
  set_device(op, target);
  dispatch_ids(idx.dtype(), op, "an index", [&](auto itag) {
    using I = typename decltype(itag)::type;
    check_range<I>(op, "index", idx, n);
    if (count == 0 || outer == 0 || inner == 0) return;
    dispatch_positions(count, [&](auto ptag) {
      using P = typename decltype(ptag)::type;
      constexpr DType kPosDtype = position_dtype<P>();
      Tensor keys = empty({count}, {idx.dtype(), device});
      Tensor positions = empty({count}, {kPosDtype, device});
      Tensor sorted_positions = empty({count}, {kPosDtype, device});
      iota_kernel<P><<<grid_for(count), kThreads, 0, kStream>>>(ptr<P>(positions), count);
      check_launch(op);
      // Indices are in [0, n) (a bad one fails the next read, Note [Deferred device checks],
      // and the kernels below skip it), so only their low bits need sorting.
      const int end_bit =
          std::max(1, static_cast<int>(std::bit_width(static_cast<uint64_t>(n - 1))));
      size_t temp_bytes = 0;
      check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, ptr<I>(idx), ptr<I>(keys),
                                                 ptr<P>(positions), ptr<P>(sorted_positions), count,
                                                 0, end_bit, kStream),
                 op, "cub::DeviceRadixSort::SortPairs");
      Tensor temp =
          empty({std::max<int64_t>(1, static_cast<int64_t>(temp_bytes))}, {DType::u8, device});
      check_cuda(cub::DeviceRadixSort::SortPairs(
                     temp.raw_data(), temp_bytes, ptr<I>(idx), ptr<I>(keys), ptr<P>(positions),
                     ptr<P>(sorted_positions), count, 0, end_bit, kStream),
                 op, "cub::DeviceRadixSort::SortPairs");
      dispatch_cuda_floating(target.dtype(), op, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const RowLaunch launch = row_launch(outer * count, inner);
        index_add_kernel<T, I, P><<<launch.grid, launch.block, 0, kStream>>>(
            ptr<T>(target), ptr<T>(s), ptr<I>(keys), ptr<P>(sorted_positions), outer, n, count,
            inner);
        check_launch(op);
      });
    });
  });
  if (!in_place) out.copy_(target);
}

}  // namespace tessera::kernels::cuda
