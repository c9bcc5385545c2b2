#include "parallel/expert/all_to_all.h"

#include "autograd/record.h"
#include "core/error.h"
#include "core/factories.h"

namespace tessera::parallel {
namespace {

// The exchange itself, in a fresh tensor.
Tensor exchanged(const Tensor& x, Communicator& group) {
  TS_CHECK(x.dim() >= 1 && x.size(0) % group.size() == 0, "[expert parallel] all-to-all of ",
           shape_str(x.shape()), ": expected a first dim divisible by the group's ", group.size(),
           " ranks");
  const Tensor in = x.detach().contiguous();
  const Tensor out = empty(in.shape(), {in.dtype(), in.device()});
  group.all_to_all(in.view({in.numel()}), out.view({out.numel()}));
  return out;
}

}  // namespace

Tensor all_to_all_rows(const Tensor& x, Communicator& group) {
  if (group.size() == 1) return x;  // nothing to move, nothing to record
  Tensor y = exchanged(x, group);
  record_function("all_to_all_rows", {x}, {&y},
                  [&group](const TensorList& g) { return TensorList{exchanged(g[0], group)}; });
  return y;
}

}  // namespace tessera::parallel
