// DeepSpeed's flops profiler (deepspeed/profiling/flops_profiler/profiler.py): at one
// step, each module's parameters, forward MACs and FLOPs and forward latency, counted from
// the ops the forward actually recorded, in DeepSpeed's report layout, next to the model's
// analytic FLOPs.
//
// Note [Flops profiler]
// The profiler is a ForwardObserver (Note [Forward observers] in
// autograd/forward_observer.h) installed on rank 0's thread for the forwards of the step
// after `profile_step` optimizer steps (global_steps == profile_step, as DeepSpeed: 1 is the
// second step). Each recorded op is charged to the innermost module whose forward is
// running, by DeepSpeed's counting rules: linear 2 x numel(x) x out FLOPs and numel(x) x out
// MACs (its bias not counted), matmul 2 x numel(A) x N, causal attention 2 x (numel(q) x Lk
// + numel(q) / D x Lk x Dv) (scale, mask and softmax not counted), softmax numel(x),
// layer_norm 5 numel(x) with a weight, GELU and ReLU numel(x), add and mul the output's
// numel, every other op (division, exp, embedding, dropout, cross-entropy, block-sparse
// kernels) 0. Ops outside every module (the loss) are not counted. A module's figures add
// its children's; its latency is the wall time between its forward's entry and exit (on
// the host: a CUDA run's is launch time unless the device synchronizes), or its children's
// sum when it has none of its own. Figures are per forward pass: the step's sums over its
// micro-batches divided by their number (DeepSpeed profiles each micro-step and prints the
// report once per micro-step; here it is printed once). Only forwards with gradients record
// their ops, so activation checkpointing (whose forward runs without them, and whose
// recomputation would be counted in backward) is refused with the profiler. Backward and step
// latencies come from the engine's wall_clock_breakdown timers, which the profiler switches on, as
// DeepSpeed does.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "autograd/forward_observer.h"
#include "autograd/module.h"
#include "core/json.h"

namespace tessera::train {

// The "flops_profiler" section, DeepSpeed's keys and defaults.
struct FlopsProfilerConfig {
  bool enabled = false;
  double recompute_fwd_factor = 0.0;  // forward recomputation in backward (1.0: full)
  int64_t profile_step = 1;           // global_steps at the profiled step
  int64_t module_depth = -1;          // depths in the aggregated table (-1: all but the last)
  int64_t top_modules = 1;            // classes per depth in the aggregated table
  bool detailed = true;               // the per-module tree
  std::string output_file;            // empty: the log
};
FlopsProfilerConfig read_flops_profiler_config(JsonObjectReader& root);

// FLOPs and MACs of one recorded op by DeepSpeed's rules (Note [Flops profiler]).
struct OpCost {
  double flops = 0;
  double macs = 0;
};
OpCost op_cost(const std::string& name, const TensorList& inputs,
               const std::vector<OutputInfo>& outputs);

// DeepSpeed's number_to_string: "3.14 T", "833.75 u", "12 " (units T, G, M, K, none, m, u;
// two decimals, trailing zeros dropped as Python's %g does).
std::string number_to_string(double value);

// What the summary lines say besides the profile itself.
struct ProfileContext {
  int64_t step = 0;               // profile_step
  int64_t world = 1;              // ranks
  int64_t data_parallel = 1;      // data-parallel size
  int64_t model_parallel = 1;     // pipeline stages x tensor-parallel ranks
  int64_t micro_batch = 1;        // sequences per forward on this rank
  int64_t forwards = 1;           // forward passes in the profiled step (micro-batches)
  double backward_s = 0;          // the step's backward passes (wall_clock_breakdown)
  double step_s = 0;              // its optimizer step
  double analytic_fwd_flops = 0;  // the model's formula, per forward on this rank (0: none)
};

// Writes `report` to config.output_file (replaced, its folders made) or, without one, to
// standard output; throws naming the file when it cannot.
void publish_report(const FlopsProfilerConfig& config, const std::string& report);

class FlopsProfiler : public ForwardObserver {
 public:
  // Profiles forwards of `model` (the root its report starts from); `model` must outlive it.
  explicit FlopsProfiler(const Module& model);

  void enter(const Module& m) override;
  void exit(const Module& m) noexcept override;
  void op(const Node& node, const TensorList& inputs) override;

  // A module's figures over the forwards seen: its own and its descendants' ops, and its
  // latency (Note [Flops profiler]).
  struct Totals {
    int64_t params = 0;
    double flops = 0;
    double macs = 0;
    double seconds = 0;
  };
  Totals totals(const Module& m) const;
  // The report in DeepSpeed's layout (deepspeed/profiling/flops_profiler/profiler.py's
  // print_model_profile), per forward.
  std::string report(const FlopsProfilerConfig& config, const ProfileContext& context) const;

 private:
  struct Own {
    double flops = 0, macs = 0, seconds = 0;
  };
  struct Open {
    const Module* module;
    double started;  // seconds on the steady clock
  };
  using TotalsMap = std::map<const Module*, Totals>;
  // totals() of `m`, recording it and each descendant's in `out`.
  Totals add_totals(const Module& m, TotalsMap& out) const;
  const Module& root_;
  std::map<const Module*, Own> own_;
  std::map<const Module*, int> depth_;  // open forwards per module
  std::vector<Open> stack_;             // the outermost open forward of each module
};

}  // namespace tessera::train
