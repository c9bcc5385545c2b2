// The precision ZeroOptimizer trains in (Note [Mixed precision] in zero_optimizer.h):
// DeepSpeed's fp16 / bf16 sections, its communication_data_type and its
// data_types.grad_accum_dtype.
#pragma once

#include <optional>

#include "core/dtype.h"
#include "optim/loss_scaler.h"

namespace tessera::parallel {

struct MixedPrecision {
  MixedPrecision() = default;
  // `dtype` with DeepSpeed's defaults for the communication and the accumulation.
  explicit MixedPrecision(DType dtype, optim::LossScalerConfig scaler = {})
      : dtype(dtype), scaler(scaler) {}

  DType dtype = DType::f32;        // of the parameters: f32, or f16/bf16 with f32 masters
  optim::LossScalerConfig scaler;  // used with f16 only
  // The dtype gradients are reduced in (f32, f16 or bf16); unset: the parameters' dtype,
  // DeepSpeed's default (deepspeed/runtime/engine.py, communication_data_type).
  std::optional<DType> communication;
  // The dtype gradients accumulate in over a step's micro-batches at stages 0-1 (f32 or
  // the parameters' dtype); unset: f32 for bf16 (DeepSpeed's BF16_Optimizer, which
  // deepspeed/runtime/engine.py requires for bf16 without ZeRO) and the parameters' dtype
  // otherwise. Stages 2-3 add each micro-batch's reduced gradient into an f32 shard, so
  // they accumulate in f32 whatever is set.
  std::optional<DType> accumulation;

  DType communication_dtype() const { return communication.value_or(dtype); }
  DType accumulation_dtype(int stage) const;
};

// Checks `precision` for a ZeRO stage: the parameters f32, f16 or bf16; the communication
// f32, bf16, or f16 with f16 parameters; the accumulation f32 or the parameters' dtype, and
// f32 at stages 2-3.
// The error names what was expected and what was found.
void check_mixed_precision(const MixedPrecision& precision, int stage);

}  // namespace tessera::parallel
