// ZeroOffload: a ZeRO optimizer's state in NVMe swap files between steps
// (zero_optimization.offload_optimizer with "device": "nvme"; Note [Offloaded optimizer
// state] in parallel/offload/swapped_optimizer_state.h).
//
// Note [ZeRO's offloaded state]
// The sub-groups are runs of consecutive blocks, each closed once its chunks hold
// sub_group_size elements or more (DeepSpeed's rule, deepspeed/runtime/zero/stage3.py). What goes
// to the file with a sub-group's optimizer state: at stages 1-2 with 16-bit parameters, its blocks'
// f32 master chunks (each a storage of its own: MasterWeights), which the step rounds into the
// model while they are in memory; with f32 parameters the chunks are the model's own parameters and
// stay, and at stage 3 the f32 shard stays too (the gathers read it with f32 parameters; a
// per-sub-group shard for 16-bit ones is to come). Each rank writes its own file,
// <nvme_path>/tessera_optimizer_<pid>_<rank>_<object>.swp, unlinked as soon as it is open,
// so that nothing is left when the process ends, however it ends; checkpoints, not swap
// files, are what survives it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "optim/optimizer.h"
#include "parallel/comm/communicator.h"
#include "parallel/offload/swapped_optimizer_state.h"
#include "parallel/offload/tensor_swapper.h"
#include "parallel/zero/flat_layout.h"
#include "parallel/zero/zero_config.h"

namespace tessera::parallel {

class ZeroOffload {
 public:
  // `inner` steps one parameter per block, named chunk_name(b) (zero_state.h); `masters`
  // holds block b's f32 master chunk to swap with its state, or is empty. `inner` and
  // `layout` must outlive this.
  ZeroOffload(const ZeroConfig& config, const FlatLayout& layout, optim::Optimizer& inner,
              const std::vector<Tensor>& masters, const Communicator& dp);
  ZeroOffload(const ZeroOffload&) = delete;
  ZeroOffload& operator=(const ZeroOffload&) = delete;

  // One optimizer step, a sub-group at a time; `after_block(b)` runs for each of a
  // sub-group's blocks while it is in memory, after its update.
  void step(const std::function<void(int64_t block)>& after_block);
  // SwappedOptimizerState::make_resident, swap_out_resident and state_replaced.
  void make_resident() { state_->make_resident(); }
  void swap_out_resident() { state_->swap_out_resident(); }
  void state_replaced() { state_->state_replaced(); }
  // Bytes of the optimizer state and masters in memory now, and in the swap file only.
  int64_t resident_bytes() const { return state_->resident_bytes(); }
  int64_t swapped_bytes() const { return swapper_->swapped_bytes(); }

 private:
  std::vector<std::vector<int64_t>> blocks_;  // per sub-group
  std::unique_ptr<TensorSwapper> swapper_;
  std::unique_ptr<SwappedOptimizerState> state_;
};

}  // namespace tessera::parallel
