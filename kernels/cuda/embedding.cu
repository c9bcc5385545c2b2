// CUDA embedding: rows of the weight gathered by id, and their gradient summed per id.
//
// Note [Deterministic embedding backward]
// Repeated ids would make an atomicAdd scatter order-dependent. Instead the (id,
// position) pairs are radix-sorted (stable, so equal ids keep position order), each id's
// run [start, end) in the sorted order is recorded, and one block row per vocabulary row
// sums its gradient rows in position order in acc_t and writes the row once; ids with no
// occurrence get zeros. For f32/f64 this is the CPU kernel's summation order bit for bit.
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

// out row r = weight row ids[r], in words U; an id outside [0, vocab) (failing the next
// read, Note [Deferred device checks]) gives a zero row rather than a wild read.
template <class U, class I>
__global__ void gather_rows_kernel(U* __restrict__ out, const U* __restrict__ weight,
                                   const I* __restrict__ ids, int64_t rows, int64_t vocab,
                                   int64_t width) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.y} + threadIdx.y; r < rows;
       r += int64_t{gridDim.x} * blockDim.y) {
    const int64_t v = static_cast<int64_t>(ids[r]);
    const bool valid = v >= 0 && v < vocab;
    const U* from = weight + (valid ? v : 0) * width;
    U* to = out + r * width;
    for (int64_t c = blockIdx.y * int64_t{blockDim.x} + threadIdx.x; c < width;
         c += int64_t{gridDim.y} * blockDim.x) {
      to[c] = valid ? from[c] : U{};
    }
  }
}

// start[v], end[v] = the run of id v in the sorted ids (left 0, 0 by the memset when v
// does not occur). Each entry is written by exactly one thread: the run's first or last.
template <class I, class P>
__global__ void run_bounds_kernel(const I* __restrict__ sorted, int64_t n, int64_t vocab,
                                  P* __restrict__ start, P* __restrict__ end) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n;
       k += int64_t{gridDim.x} * blockDim.x) {
    const I v = sorted[k];
    if (v < 0 || v >= vocab) continue;
    if (k == 0 || sorted[k - 1] != v) start[v] = static_cast<P>(k);
    if (k == n - 1 || sorted[k + 1] != v) end[v] = static_cast<P>(k + 1);
  }
}

// dweight[v, c] = (or +=, when Accumulate; rows without ids are then left alone) sum over
// k in [start[v], end[v]) of grad[pos[k], c], in k order (see
// Note [Deterministic embedding backward]). Four loads are issued before their adds so
// long runs (a padding id) are not latency bound; the add order is unchanged.
template <class T, class P, bool Accumulate>
__global__ void sum_rows_kernel(T* __restrict__ dweight, const T* __restrict__ grad,
                                const P* __restrict__ pos, const P* __restrict__ start,
                                const P* __restrict__ end, int64_t vocab, int64_t channels) {
  using A = acc_t<T>;
  for (int64_t v = blockIdx.x * int64_t{blockDim.y} + threadIdx.y; v < vocab;
       v += int64_t{gridDim.x} * blockDim.y) {
    const int64_t lo = start[v];
    const int64_t hi = end[v];
    if (Accumulate && lo == hi) continue;  // no id v: the row keeps its value
    for (int64_t c = blockIdx.y * int64_t{blockDim.x} + threadIdx.x; c < channels;
         c += int64_t{gridDim.y} * blockDim.x) {
      A acc = A(0);
      int64_t k = lo;
      for (; k + 4 <= hi; k += 4) {
        const A a0 = to_acc(grad[static_cast<int64_t>(pos[k]) * channels + c]);
        const A a1 = to_acc(grad[static_cast<int64_t>(pos[k + 1]) * channels + c]);
        const A a2 = to_acc(grad[static_cast<int64_t>(pos[k + 2]) * channels + c]);
        const A a3 = to_acc(grad[static_cast<int64_t>(pos[k + 3]) * channels + c]);
        acc += a0;
        acc += a1;
        acc += a2;
        acc += a3;
      }
      for (; k < hi; ++k) acc += to_acc(grad[static_cast<int64_t>(pos[k]) * channels + c]);
      T& out = dweight[v * channels + c];
      out = from_acc<T>(Accumulate ? to_acc(out) + acc : acc);
    }
  }
}

}  // namespace

Tensor embedding(const Tensor& weight, const Tensor& ids) {  // (V, C), (...) -> (..., C)
  const char* op = "embedding";
  const Tensor w = weight.detach().contiguous();
  const Tensor id = ids.detach().contiguous();
  const int64_t vocab = w.size(0);
  const int64_t channels = w.size(1);
  const int64_t count = id.numel();
  Shape shape = id.shape();
  shape.push_back(channels);
  set_device(op, w);
  Tensor out = empty(shape, {w.dtype(), w.device()});
  dispatch_ids(id.dtype(), op, "ids", [&](auto itag) {
    using I = typename decltype(itag)::type;
    check_range<I>(op, "ids", id, vocab);
    if (count == 0 || channels == 0) return;
    const int64_t row_bytes = channels * static_cast<int64_t>(w.itemsize());
    const int unit =
        copy_unit({static_cast<uint64_t>(row_bytes), reinterpret_cast<uint64_t>(w.raw_data()),
                   reinterpret_cast<uint64_t>(out.raw_data())});
    dispatch_unit(unit, [&](auto utag) {
      using U = typename decltype(utag)::type;
      const int64_t width = row_bytes / static_cast<int64_t>(sizeof(U));
      const RowLaunch launch = row_launch(count, width);
      gather_rows_kernel<U, I><<<launch.grid, launch.block, 0, kStream>>>(
          ptr<U>(out), ptr<U>(w), ptr<I>(id), count, vocab, width);
      check_launch(op);
    });
  });
  return out;
}

namespace {

// dweight (V, C) = (or +=, when accumulate) the sums of grad's rows by id.
void sum_rows_by_id(const char* op, const Tensor& dweight, const Tensor& grad, const Tensor& ids,
                    bool accumulate) {
  const Tensor g = grad.detach().contiguous();
  const Tensor id = ids.detach().contiguous();
  const int64_t num_embeddings = dweight.size(0);
  const int64_t channels = g.size(-1);
  const int64_t count = id.numel();
  const Device device = g.device();
  set_device(op, g);
  dispatch_ids(id.dtype(), op, "ids", [&](auto itag) {
    using I = typename decltype(itag)::type;
    check_range<I>(op, "ids", id, num_embeddings);
    if (dweight.numel() == 0) return;
    if (count == 0) {
      if (accumulate) return;
      // All-zero bits are 0.0 in every floating dtype.
      check_cuda(cudaMemsetAsync(dweight.raw_data(), 0, dweight.nbytes(), kStream), op,
                 "cudaMemsetAsync");
      return;
    }
    dispatch_positions(count, [&](auto ptag) {
      using P = typename decltype(ptag)::type;
      constexpr DType kPosDtype = position_dtype<P>();
      Tensor sorted_ids = empty({count}, {id.dtype(), device});
      Tensor positions = empty({count}, {kPosDtype, device});
      Tensor sorted_positions = empty({count}, {kPosDtype, device});
      iota_kernel<P><<<grid_for(count), kThreads, 0, kStream>>>(ptr<P>(positions), count);
      check_launch(op);

      // Ids are in [0, V) (a bad one fails the next read, Note [Deferred device checks], and
      // the kernels below skip it), so only their low bits need sorting.
      const int end_bit =
          std::max(1, static_cast<int>(std::bit_width(static_cast<uint64_t>(num_embeddings - 1))));
      size_t temp_bytes = 0;
      check_cuda(cub::DeviceRadixSort::SortPairs(
                     nullptr, temp_bytes, ptr<I>(id), ptr<I>(sorted_ids), ptr<P>(positions),
                     ptr<P>(sorted_positions), count, 0, end_bit, kStream),
                 op, "cub::DeviceRadixSort::SortPairs");
      Tensor temp =
          empty({std::max<int64_t>(1, static_cast<int64_t>(temp_bytes))}, {DType::u8, device});
      check_cuda(cub::DeviceRadixSort::SortPairs(
                     temp.raw_data(), temp_bytes, ptr<I>(id), ptr<I>(sorted_ids), ptr<P>(positions),
                     ptr<P>(sorted_positions), count, 0, end_bit, kStream),
                 op, "cub::DeviceRadixSort::SortPairs");

      Tensor bounds = empty({2 * num_embeddings}, {kPosDtype, device});  // start, then end
      check_cuda(cudaMemsetAsync(bounds.raw_data(), 0, bounds.nbytes(), kStream), op,
                 "cudaMemsetAsync");
      P* start = ptr<P>(bounds);
      P* end = start + num_embeddings;
      run_bounds_kernel<I, P><<<grid_for(count), kThreads, 0, kStream>>>(
          ptr<I>(sorted_ids), count, num_embeddings, start, end);
      check_launch(op);

      dispatch_cuda_floating(g.dtype(), op, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const RowLaunch launch = row_launch(num_embeddings, channels);
        if (accumulate) {
          sum_rows_kernel<T, P, true><<<launch.grid, launch.block, 0, kStream>>>(
              ptr<T>(dweight), ptr<T>(g), ptr<P>(sorted_positions), start, end, num_embeddings,
              channels);
        } else {
          sum_rows_kernel<T, P, false><<<launch.grid, launch.block, 0, kStream>>>(
              ptr<T>(dweight), ptr<T>(g), ptr<P>(sorted_positions), start, end, num_embeddings,
              channels);
        }
        check_launch(op);
      });
    });
  });
}

}  // namespace

Tensor embedding_backward(const Tensor& grad, const Tensor& ids,
                          int64_t num_embeddings) {  // (..., C), (...) -> (V, C)
  const char* op = "embedding_backward";
  set_device(op, grad);
  Tensor dweight = empty({num_embeddings, grad.size(-1)}, {grad.dtype(), grad.device()});
  sum_rows_by_id(op, dweight, grad, ids, false);
  return dweight;
}

void embedding_backward_add_(const Tensor& dweight, const Tensor& grad,
                             const Tensor& ids) {  // (V, C) += (..., C) by (...)
  sum_rows_by_id("embedding_backward_add_", dweight, grad, ids, true);
}

}  // namespace tessera::kernels::cuda
