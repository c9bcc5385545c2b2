// CPU reductions; inputs are validated by kernels/reduce.cc.
#pragma once

#include "kernels/reduce.h"

namespace tessera::kernels::cpu {

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim);  // (*) -> (*r)
Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction,
           bool keepdim);                                   // (*) -> (*r)
MaxResult max(const Tensor& x, int64_t dim, bool keepdim);  // (*) -> (*r), (*r) i64

}  // namespace tessera::kernels::cpu
