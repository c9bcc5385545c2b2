// Module: the base of layers and models, with hierarchical parameter names.
//
// A module registers its parameters (Tensor members) and its child modules (members,
// by reference) under names; named_parameters() walks the tree and joins names with
// dots, Hugging Face style: "h.3.attn.c_attn.weight". Modules are neither copyable nor
// movable because the registry points at their members.
//
// A module's forward opens a ModuleCall so that hooks installed on the tree
// (Module::set_hooks) run around it; ZeRO stage 3 gathers a module's partitioned
// parameters there (parallel/zero/zero_optimizer.h).
//
// Note [Partitioned construction]
// A model built under a DeferredInitGuard has parameters with names, shapes and dtypes but
// no memory: register_parameter() releases each one's storage as its module registers it,
// so construction holds at most one parameter at a time, and a model's initialization
// (its constructor's init pass) skips the parameters that are not materialized(). ZeRO
// stage 3 then materializes each parameter once, whole, fills it with the model's
// init_parameter(name) (a function of the seed and the name, so the values equal those of
// an unpartitioned build), keeps this rank's chunk and frees it again: the rank never holds
// more than its shard and the largest parameter. DeepSpeed's deepspeed.zero.Init does the
// same for PyTorch modules (deepspeed/runtime/zero/partition_parameters.py).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/forward_observer.h"
#include "core/tensor.h"

namespace tessera {

// How a parameter is laid out across a model-parallel group.
struct Placement {
  enum class Kind : uint8_t { replicated, sharded };
  Kind kind = Kind::replicated;
  int64_t dim = 0;    // the split dim when sharded
  int64_t parts = 1;  // equal blocks along dim, each split on its own (3: fused q, k, v)
};

struct NamedParameter {
  std::string name;
  Tensor tensor;
  Placement placement;
};

// Name -> tensor, in registration order.
using StateDict = std::vector<std::pair<std::string, Tensor>>;

class Module;

// Hooks around the calls of modules' forwards (see ModuleCall).
class ModuleHooks {
 public:
  virtual ~ModuleHooks() = default;
  // Before the forward body of `m` runs.
  virtual void pre_forward(const Module& m) = 0;
  // After the body has run, or thrown.
  virtual void post_forward(const Module& m) noexcept = 0;
  // In backward, when the gradient of a call's output arrives: before any backward node
  // recorded inside that call runs.
  virtual void pre_backward(const Module& m) = 0;
};

// Builds modules unmaterialized for its lifetime, on this thread (Note [Partitioned
// construction]); thread-local like GradMode (core/grad_mode.h), since thread ranks build
// their models concurrently.
class DeferredInitGuard {
 public:
  DeferredInitGuard();
  ~DeferredInitGuard();
  DeferredInitGuard(const DeferredInitGuard&) = delete;
  DeferredInitGuard& operator=(const DeferredInitGuard&) = delete;
  // Whether one is alive on this thread.
  static bool active();

 private:
  bool prev_;
};

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Parameters of this module and all descendants, in registration order (depth first).
  std::vector<NamedParameter> named_parameters() const;
  std::vector<Tensor> parameters() const;
  // Parameters and buffers by full name.
  StateDict state_dict() const;
  // Copies values into this module's parameters and buffers. Every problem (missing or,
  // when `strict`, unexpected names; shape or dtype mismatches) is found before anything is
  // written, and reported together in one error.
  void load_state_dict(const StateDict& state, bool strict = true);
  // Training mode for this module and its descendants (dropout is active in training).
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Drops the accumulated gradients of all parameters.
  void zero_grad();
  // Moves every parameter and buffer to `device` and converts the floating parameters to
  // `dtype`, in place (PyTorch's module.to(device, dtype)): tensors keep their identity and
  // autograd state, so references held elsewhere see the new data. Gradients are dropped.
  // Parameters that are not materialized stay so, with the new dtype and device.
  void to(Device device, DType dtype);
  // The parameters this module registered itself (not its descendants'), in order.
  std::vector<Tensor> own_parameters() const;
  // The registered child modules, by name, in order.
  const std::vector<std::pair<std::string, Module*>>& children() const { return children_; }
  // Installs `hooks` (null: none) on this module and all descendants.
  void set_hooks(const std::shared_ptr<ModuleHooks>& hooks);
  const std::shared_ptr<ModuleHooks>& hooks() const { return hooks_; }

 protected:
  // Registers a member tensor as a parameter (it becomes a leaf that requires grad); under
  // a DeferredInitGuard its memory is released.
  void register_parameter(std::string name, Tensor& param, Placement placement = {});
  // Registers a member tensor that is saved in the state dict but not trained.
  void register_buffer(std::string name, Tensor& buffer);
  // Registers a member module as a child named `name`.
  void register_module(std::string name, Module& child);

 private:
  struct ParamEntry {
    std::string name;
    Tensor* tensor;
    Placement placement;
  };
  void collect(const std::string& prefix, std::vector<NamedParameter>* params,
               StateDict* buffers) const;

  std::vector<ParamEntry> params_;
  std::vector<std::pair<std::string, Tensor*>> buffers_;
  std::vector<std::pair<std::string, Module*>> children_;
  bool training_ = true;
  std::shared_ptr<ModuleHooks> hooks_;
};

// The module's class name without namespaces: "Block", "Linear" (for reports).
std::string class_name(const Module& m);

// One call of a module's forward, for its hooks. A Layer's call operator opens one; every
// other forward that reads a module's parameters opens one on that module and routes its
// result through output():
//
//   Tensor Linear::forward(const Tensor& x) const {
//     const ModuleCall call(*this);                   // hooks' pre_forward
//     return call.output(linear(x, weight_, bias_));  // pre_backward when its grad arrives
//   }                                                 // post_forward
//
// A forward that reads another module's parameters (a tied weight) opens a call on that
// module. Without hooks a ModuleCall does nothing.
class ModuleCall {
 public:
  explicit ModuleCall(const Module& m);
  ~ModuleCall();
  ModuleCall(const ModuleCall&) = delete;
  ModuleCall& operator=(const ModuleCall&) = delete;

  // `y`, through an identity node that runs the hooks' pre_backward(m) in backward (`y`
  // itself when there are no hooks or no gradient flows).
  Tensor output(const Tensor& y) const;

 private:
  const Module& module_;
  std::shared_ptr<ModuleHooks> hooks_;
  ModuleScope scope_;  // for forward observers (Note [Forward observers])
};

// A module with one tensor in and one out whose forward reads its own parameters (Linear,
// LayerNorm, Embedding, the tensor-parallel layers). Callers use the call operator, which
// wraps the protected forward in the ModuleCall that hooks (ZeRO stage 3's parameter
// gathering) need, so a layer's author cannot forget it:
//
//   class Scale : public Layer {
//    protected:
//     Tensor forward(const Tensor& x) const override { return mul(x, weight_); }
//   };
//   Tensor y = scale(x);
class Layer : public Module {
 public:
  Tensor operator()(const Tensor& x) const {
    const ModuleCall call(*this);
    return call.output(forward(x));
  }

 protected:
  virtual Tensor forward(const Tensor& x) const = 0;
};

// Modules owned elsewhere under one root, for installing hooks on them together (an
// optimizer's expert part: Note [Expert parameters] in parallel/zero/zero_optimizer.h).
class ModuleRefs : public Module {
 public:
  // Registers each of `modules` under its index ("0", "1", ...); they must outlive this.
  explicit ModuleRefs(const std::vector<Module*>& modules);
};

// An indexed list of owned child modules named "0", "1", ... (from `first_index` on: a
// pipeline stage holds blocks 4..7 of a model under their model-wide names).
class ModuleList : public Module {
 public:
  explicit ModuleList(int64_t first_index = 0) : first_index_(first_index) {}
  // Takes ownership of `module` and registers it under the next index.
  template <class M>
  M& push_back(std::unique_ptr<M> module) {
    M& ref = *module;
    register_module(std::to_string(first_index_ + static_cast<int64_t>(items_.size())), ref);
    items_.push_back(std::move(module));
    return ref;
  }
  size_t size() const { return items_.size(); }
  Module& operator[](size_t i) const { return *items_.at(i); }

 private:
  int64_t first_index_;
  std::vector<std::unique_ptr<Module>> items_;
};

}  // namespace tessera
