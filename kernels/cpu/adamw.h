// CPU fused Adam/AdamW step (see kernels/adamw.h).
#pragma once

#include "kernels/adamw.h"

namespace tessera::kernels::cpu {

// In place on contiguous tensors of one shape and dtype: param, exp_avg, exp_avg_sq.
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWParams& p);

}  // namespace tessera::kernels::cpu
