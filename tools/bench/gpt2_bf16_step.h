// gpt2_step_bench --dtype bf16: the GPT-2 124M training step in bf16 mixed precision
// against our own fp32 step and PyTorch's fp32 and CPU-autocast bf16 steps, in one run.
//
// Note [bf16 step benchmark]
// Our bf16 step is the trainer's: a bf16 model (parameters, activations and gradients;
// every product and sum accumulated in f32, Note [16-bit math on the CPU]) with f32 master
// weights and AdamW state in a ZeroOptimizer at stage 0 (Note [Mixed precision]). The fp32
// step is gpt2_step_bench's. The four steps (ours f32 and bf16, PyTorch's f32 and bf16 as
// coprocesses) take turns in rounds, so a drift in the shared host's speed hits all of
// them; medians over all rounds are compared. The target is stated against our own fp32
// step (bf16 at least 1.6x faster), not against PyTorch, whose CPU speed swings several-fold
// between runs on these hosts. Each step's share of peak is against the peak of its own
// arithmetic, measured before and after the steps by tools/perf/fma_peak (the higher of the
// two): the f32 FMA peak for f32, that of the bf16 GEMM's instruction for bf16 (AMX's
// tdpbf16ps or vdpbf16ps: tools/perf/fma_peak.h).
#pragma once

#include <cstdint>
#include <optional>

#include "tools/bench/torch_reference.h"

namespace tessera::bench {

struct Bf16StepOptions {
  int64_t steps = 10;  // timed steps of each contender
  int64_t round = 2;   // steps per turn
  int64_t warmup = 2;  // untimed steps first
  int threads = 2;
  int64_t batch = 4;  // tokens per step: batch x seq
  int64_t seq = 64;
  // The PyTorch references' settings (batch, seq, warm-up and threads as above); none
  // without --no-torch.
  std::optional<TorchReferenceOptions> torch;
};

// Runs the comparison and prints it; returns the process exit code.
int run_bf16_step_comparison(const Bf16StepOptions& options);

}  // namespace tessera::bench
