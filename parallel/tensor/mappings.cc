#include "parallel/tensor/mappings.h"

#include <vector>

#include "autograd/record.h"
#include "core/error.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "kernels/index.h"

namespace tessera::parallel {
namespace {

// The sum over the group, in a fresh tensor.
Tensor all_reduced(const Tensor& x, Communicator& group) {
  Tensor out = x.detach().contiguous().clone();
  group.all_reduce(out);
  return out;
}

// This rank's piece of the last dim (contiguous).
Tensor own_slice(const Tensor& x, Communicator& group) {
  const int64_t last = x.size(-1);
  TS_CHECK(last % group.size() == 0, "[tensor parallel] expected a last dim divisible by the ",
           "model-parallel size ", group.size(), ", found shape ", shape_str(x.shape()));
  const int64_t n = last / group.size();
  return x.detach().narrow(-1, group.rank() * n, n).contiguous();
}

// The ranks' (..., n) pieces side by side: (..., n * size).
Tensor gathered(const Tensor& x, Communicator& group) {
  const Tensor mine = x.detach().contiguous();
  Shape stacked = mine.shape();
  stacked.insert(stacked.begin(), group.size());
  const Tensor all = empty(stacked, {mine.dtype(), mine.device()});  // (size, ..., n)
  group.all_gather(mine, all);
  // (size, ..., n) -> (..., size, n) -> (..., size * n)
  std::vector<Tensor> pieces;
  for (int r = 0; r < group.size(); ++r) pieces.push_back(all.select(0, r));
  return kernels::cat(pieces, -1);
}

// Records y, the sum of x over the group, as reduce_from_model_parallel's output: its
// gradient passes to x as it is.
void record_sum(const Tensor& x, Tensor& y) {
  record_function("reduce_from_model_parallel", {x}, {&y},
                  [](const TensorList& g) { return TensorList{g[0]}; });
}

}  // namespace

Tensor copy_to_model_parallel(const Tensor& x, Communicator& group) {
  if (group.size() == 1) return x;  // nothing to move, nothing to record
  Tensor y = x.detach();
  record_function("copy_to_model_parallel", {x}, {&y},
                  [&group](const TensorList& g) { return TensorList{all_reduced(g[0], group)}; });
  return y;
}

Tensor reduce_from_model_parallel(const Tensor& x, Communicator& group) {
  if (group.size() == 1) return x;  // nothing to move, nothing to record
  Tensor y = all_reduced(x, group);
  record_sum(x, y);
  return y;
}

PendingSum start_reduce_from_model_parallel(const Tensor& x, AsyncCollectives& async) {
  if (async.comm().size() == 1) return {x, CommHandle()};  // nothing to move or record
  // The partial product is the caller's to give up: summed where it lies.
  Tensor y = x.detach().contiguous();
  record_sum(x, y);
  return {y, async.all_reduce(y)};
}

Tensor scatter_to_model_parallel(const Tensor& x, Communicator& group) {
  if (group.size() == 1) return x;  // nothing to move, nothing to record
  Tensor y = own_slice(x, group);
  record_function("scatter_to_model_parallel", {x}, {&y},
                  [&group](const TensorList& g) { return TensorList{gathered(g[0], group)}; });
  return y;
}

Tensor gather_from_model_parallel(const Tensor& x, Communicator& group) {
  if (group.size() == 1) return x;  // nothing to move, nothing to record
  Tensor y = gathered(x, group);
  record_function("gather_from_model_parallel", {x}, {&y},
                  [&group](const TensorList& g) { return TensorList{own_slice(g[0], group)}; });
  return y;
}

Tensor model_parallel_slice(const Tensor& full, int64_t dim, int64_t parts, int rank, int size) {
  const int64_t d = dim < 0 ? dim + full.dim() : dim;
  TS_CHECK(d >= 0 && d < full.dim(), "[tensor parallel] dim ", dim, " is out of range for shape ",
           shape_str(full.shape()));
  TS_CHECK(parts >= 1 && size >= 1 && rank >= 0 && rank < size,
           "[tensor parallel] expected parts >= 1 and rank in [0, size), found parts ", parts,
           ", rank ", rank, " of ", size);
  TS_CHECK(full.size(d) % (parts * size) == 0, "[tensor parallel] dim ", d, " of shape ",
           shape_str(full.shape()), " does not split into ", parts, " x ", size,
           " equal pieces; expected a multiple of ", parts * size);
  const int64_t block = full.size(d) / parts, piece = block / size;
  std::vector<Tensor> pieces;
  for (int64_t b = 0; b < parts; ++b) {
    pieces.push_back(full.detach().narrow(d, b * block + rank * piece, piece));
  }
  return parts == 1 ? pieces[0].contiguous() : kernels::cat(pieces, d);
}

Tensor gather_model_parallel_slices(const Tensor& slice, const Placement& placement,
                                    Communicator& group) {
  if (placement.kind == Placement::Kind::replicated || group.size() == 1) return slice;
  NoGradGuard no_grad;
  const Tensor mine = slice.detach().contiguous();
  const int size = group.size();
  const Tensor all = empty({size * mine.numel()}, {mine.dtype(), mine.device()});
  group.all_gather(mine.view({mine.numel()}), all);
  // Rank r's slice holds `parts` pieces along the dim; the full tensor puts every rank's
  // piece b side by side in block b.
  const int64_t d = placement.dim, parts = placement.parts;
  const int64_t piece = mine.size(d) / parts;
  std::vector<Tensor> pieces;
  for (int64_t b = 0; b < parts; ++b) {
    for (int r = 0; r < size; ++r) {
      const Tensor rank_slice = all.narrow(0, r * mine.numel(), mine.numel()).view(mine.shape());
      pieces.push_back(rank_slice.narrow(d, b * piece, piece));
    }
  }
  return kernels::cat(pieces, d);
}

}  // namespace tessera::parallel
