// What the engine (parallel/engine/engine.h) needs of a model: DeepSpeed's engine takes any
// nn.Module with a loss, and its PipelineModule any list of layers; Tessera's takes a
// TrainableModel. GPT and BERT implement it in models/; parallel/ never includes models/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "autograd/module.h"
#include "parallel/tensor/dropout_streams.h"

namespace tessera::parallel {

// What one mixture-of-experts layer's gate did over some forward passes (the trainer logs
// it per step: DeepSpeed's exp_counts and the load-balancing loss).
struct ExpertLoad {
  int64_t block = 0;            // the layer's index in the model (GPT: its block)
  std::vector<int64_t> tokens;  // per expert: tokens routed to it, dropped ones included
  int64_t dropped = 0;          // choices dropped for capacity
  int64_t capacity = 0;         // the last pass's slots per expert
  double aux_loss = 0;          // the load-balancing loss, summed over the passes
  int64_t passes = 0;           // forward passes counted
};

// The parallel modes a model kind supports beyond data parallelism and ZeRO.
struct ModelCapabilities {
  bool pipeline = false;        // forward_stage() runs one pipeline stage's layers
  bool tensor_slicing = false;  // built over a model group, its weights are slices
};

class TrainableModel : public Module {
 public:
  // The model's output for one micro-batch's inputs (token ids (B, T) for the language
  // models: logits (B, T, Vp), this rank's vocabulary slice under tensor slicing). Needs
  // every layer (a model built as one pipeline stage runs forward_stage()).
  virtual Tensor forward(const Tensor& inputs) const = 0;
  // The scalar loss of forward()'s (or the last stage's) output against `targets`.
  // Collective over the model group under tensor slicing.
  virtual Tensor loss(const Tensor& output, const Tensor& targets) const = 0;
  // The dropout streams (Note [Model-parallel dropout] in parallel/tensor/dropout_streams.h).
  // The engine keys them for every step (Note [Dropout per step] in parallel/engine/engine.h).
  virtual DropoutStreams& dropout_streams() = 0;
  // Recompute layers in backward instead of storing their activations: every `interval`
  // consecutive layers form one checkpoint (0: none), kept and timed as `policy` says.
  virtual void set_activation_checkpointing(int64_t interval, CheckpointPolicy policy = {}) = 0;
  // Waits on the host for communication the model started itself and may still have
  // travelling (GPT's tensor-parallel input-gradient sums, which NCCL leaves queued on its
  // stream: Note [Overlapped input gradients] in parallel/tensor/layers.h), rethrowing its
  // error. The engine calls it before each optimizer step.
  virtual void wait_for_communication() {}

  // A pipeline stage without the loss: the scalar loss term its latest forward_stage() made
  // besides its output (an MoE model's load-balancing losses, which the last stage's loss()
  // adds for its own layers), backpropagated with the loss's seed; undefined by default.
  virtual Tensor stage_extra_loss() const { return Tensor(); }
  // Mixture-of-experts models: per MoE layer, what its gate did in the training forward
  // passes since the last call, which starts the count afresh (none by default).
  virtual std::vector<ExpertLoad> take_expert_load() { return {}; }
  // Mixture-of-experts models: whether the parameter `name` (of this model or of the same
  // model under another expert-parallel layout) belongs to an expert, whose gradients the
  // engine reduces over the expert-data group (Note [Expert parameters] in
  // parallel/zero/zero_optimizer.h); false by default.
  virtual bool is_expert_parameter(const std::string& name) const { return false; }
  // Mixture-of-experts models: the modules that hold this rank's experts (each MoE layer's
  // list of them), holding no other parameters; none by default.
  virtual std::vector<Module*> expert_modules() { return {}; }

  // Progressive layer drop (Note [Progressive layer drop] in parallel/layer_drop.h): the
  // training forwards from now on keep layers by `theta`, drawing with the key of optimizer
  // step `step` (each forward since this call draws afresh). The engine calls it before each
  // step's forwards. Throws for models without it (the default).
  virtual void set_layer_drop(double theta, int64_t step);

  // The parallel modes this model supports beyond data parallelism (none by default).
  virtual ModelCapabilities capabilities() const { return {}; }
  // Pipelines (capabilities().pipeline): this stage's layers on the first stage's inputs
  // or the previous stage's output; the last stage returns what loss() takes.
  virtual Tensor forward_stage(const Tensor& input) const;
  // Pipelines: the parameters this stage holds that other stages hold copies of and that
  // must take the same step (DeepSpeed's TiedLayerSpec; GPT's wte on its first and last
  // stage). Every stage holding any lists the same names in the same order; their
  // gradients are summed over those stages before the optimizer steps.
  virtual std::vector<std::string> tied_parameter_names() const { return {}; }
  // Writes parameter `name`'s initial value into `out` (f32, the parameter's shape on this
  // rank): what construction gives it, a function of the model's seed and the name, so a
  // model built unmaterialized can be initialized one parameter at a time (Note
  // [Partitioned construction] in autograd/module.h). Throws for models that cannot.
  virtual void init_parameter(const std::string& name, const Tensor& out) const;
};

}  // namespace tessera::parallel
