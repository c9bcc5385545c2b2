// Note [One-pass mixed-precision step] in parallel/zero/zero_optimizer.h on any device:
// prepare_step() + step(), which clips and steps in the optimizer's one pass from a factor
// computed where the gradients are, against clip_grad_norm() + step(), which reads the norm
// and scales the gradients first. The norms, skipped steps, loss scales, masters and 16-bit
// models must be the same bits, in f32, bf16 and fp16 (its first steps overflow), at ZeRO
// stages 0-2, clipping on and off; the 16-bit model must be its masters rounded.
#pragma once

#include <vector>

#include "core/device.h"

namespace tessera::parallel::testing {

// Runs the comparison on `device` for each number of thread ranks in `worlds`, with Catch
// assertions (kernels/adamw_test.cc proves the pass itself equal to the separate passes).
void check_one_pass_step(Device device, const std::vector<int>& worlds);

}  // namespace tessera::parallel::testing
