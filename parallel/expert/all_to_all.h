// The token exchange of expert parallelism (DeepSpeed's _AllToAll in
// deepspeed/moe/sharded_moe.py) as an autograd op over an expert-parallel group.
#pragma once

#include "core/tensor.h"
#include "parallel/comm/communicator.h"

namespace tessera::parallel {

// x (P * n, ...) over a group of P ranks: block j of dim 0 (n rows) goes to rank j, and
// block i of the result came from rank i. Its gradient is the same exchange of the output's
// gradient, back. Collective; the group must stay alive until backward has run. Over a
// group of one it returns x itself and records nothing.
Tensor all_to_all_rows(const Tensor& x, Communicator& group);

}  // namespace tessera::parallel
