// fp16 training with DeepSpeed's dynamic loss scaler (Note [Mixed precision] in
// parallel/zero/zero_optimizer.h; Note [Dynamic loss scaling] in optim/loss_scaler.h), on
// any device: at ZeRO stages 0, 1 and 2, a ZeroOptimizer over an fp16 model (a weight
// matrix and a bias, 468 parameters) takes gradients exact in fp16 and, in between,
// overflows. The scale is applied to backward and removed before the step, an overflowed
// step is skipped and lowers the scale once the hysteresis is spent, a window of good
// steps doubles it (2^10 -> 2^10 -> 2^9 -> ... -> 2^10, DeepSpeed's sequence for
// hysteresis 2 and window 3), and the f32 masters follow a CPU f32 AdamW reference on the
// same gradients to 1e-6 while the model holds them rounded to fp16.
#pragma once

#include "core/device.h"

namespace tessera::parallel::testing {

// Runs the trajectory on `device` with Catch assertions.
void check_fp16_trajectory(Device device);

}  // namespace tessera::parallel::testing
