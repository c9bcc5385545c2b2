// Fused Adam/AdamW step with DeepSpeed FusedAdam semantics.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tessera::kernels {

struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t step = 1;  // 1-based step count after this update
  bool bias_correction = true;
  bool adam_w_mode = true;  // true: decoupled decay (AdamW); false: L2 added to grad
};

// In place: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr * ((m / bc1) / (sqrt(v / bc2) + eps) + wd p)   (adam_w_mode; else g += wd p first)
// All four tensors contiguous with one shape; param, exp_avg, exp_avg_sq f32 (or f64).
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWParams& p);

// One parameter's operands of the multi-tensor step; each entry as adamw_step's arguments.
struct AdamWTensors {
  Tensor param, grad, exp_avg, exp_avg_sq;
  // Optional: a contiguous f16 or bf16 tensor of param's shape (param f32) that the updated
  // parameter is rounded into, as model_copy.copy_(param) would after the step: a
  // mixed-precision model's weights written by the optimizer's own pass.
  Tensor model_copy;
};

// adamw_step on every entry with the same hyperparameters, element for element the same
// numbers. Every entry on one device with one dtype, and either every entry or none with
// a model_copy, all of one dtype. On CUDA the whole list takes a few launches instead of
// one per tensor (Note [Multi-tensor AdamW] in kernels/cuda/optimizers.cu).
// `grad_scale`, when defined, is a one-element f64 tensor on the tensors' device (f32 or
// f64 parameters), read there (Note [Scaled AdamW] in kernels/cuda/optimizers.cu): each
// gradient is multiplied by it first, as scale_(grad, value) would (the gradients
// themselves stay as they are), and a value that is not finite leaves every tensor
// unchanged: a skipped step. It is clip_factor()'s factor (kernels/blas1.h), so that
// unscaling, clipping, the f16 overflow skip, the update and the rounding into the
// 16-bit model are one pass, with no host read (the fused mixed-precision step).
void adamw_step(const std::vector<AdamWTensors>& tensors, const AdamWParams& p,
                const Tensor& grad_scale = Tensor());

}  // namespace tessera::kernels
