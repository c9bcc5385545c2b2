// CPU fused Adam/AdamW step (see kernels/adamw.h).
#pragma once

#include <vector>

#include "kernels/adamw.h"

namespace tessera::kernels::cpu {

// In place on contiguous tensors of one shape and dtype: param, exp_avg, exp_avg_sq.
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWParams& p);

// The same step on every entry (each as above, all of one dtype) in one parallel region:
// the threads split the entries' blocks laid end to end, so a list of many small parameters
// costs one fork and join and the threads' shares stay even (Note [AdamW in cache-sized
// blocks]).
void adamw_step(const std::vector<AdamWTensors>& tensors, const AdamWParams& p,
                const Tensor& grad_scale);

}  // namespace tessera::kernels::cpu
