// ZeroOffload: a ZeRO optimizer's state in NVMe swap files between steps
// (zero_optimization.offload_optimizer with "device": "nvme"; Note [Offloaded optimizer
// state] in parallel/offload/swapped_optimizer_state.h).
//
// Note [ZeRO's offloaded state]
// The sub-groups are runs of consecutive blocks, each closed once its chunks hold
// sub_group_size elements or more (DeepSpeed's rule, deepspeed/runtime/zero/stage3.py). What
// goes to the file with a sub-group's optimizer state:
//   - with 16-bit parameters, its blocks' f32 master chunks (each a storage of its own:
//     MasterWeights at stages 1-2, PartitionedWeights at 3, which writes each to the file as
//     soon as construction has made it), rounded into the model by the step while they are
//     in memory. f32 parameters are their own masters and stay: the model reads them;
//   - at stages 2-3, its blocks' f32 gradient chunks (BucketedGradients): each reduction
//     brings its chunks in (zeros at a step's first micro-batch, no read), adds and writes
//     them back, and the step reads them with the state and discards them. clip_grad_norm's
//     scale waits for that read (GradientReducer::prepare_chunk), and the norm is summed from
//     each chunk's squares taken as it was written. Stage 1 keeps its f32 gradient shard.
// What stays in memory at stage 3 with 16-bit parameters is then the 16-bit shard (2 bytes
// a parameter at world 1, where DeepSpeed's 16 bytes of Adam model states are; with
// offload_param "nvme" that goes too: Note [Offloaded parameters]), the swapper's
// buffers, the gathered parameters and the gradients of the reductions in flight (with
// overlap_comm, up to two buckets' worth: Note [Overlapped reductions]) with their chunks.
// Each rank writes its own file,
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

// The swap file of `dp`'s rank for the optimizer at `owner` (Note [ZeRO's offloaded
// state]), with the buffers config.offload_optimizer and config.aio ask for; gone from the
// directory when this returns.
std::unique_ptr<TensorSwapper> make_offload_swapper(const ZeroConfig& config,
                                                    const Communicator& dp, const void* owner);
// The same for stage 3's 16-bit parameter shard (Note [Offloaded parameters] in
// partitioned_params.h), with the buffers config.offload_param asks for.
std::unique_ptr<TensorSwapper> make_param_swapper(const ZeroConfig& config, const Communicator& dp,
                                                  const void* owner);

// The blocks of each sub-group: runs of consecutive blocks, each closed once its chunks hold
// `sub_group_size` elements or more (Note [ZeRO's offloaded state]).
std::vector<std::vector<int64_t>> sub_group_blocks(const FlatLayout& layout,
                                                   int64_t sub_group_size);

class ZeroOffload {
 public:
  // `inner` steps one parameter per block, named chunk_name(b) (zero_state.h).
  // `master_ids` and `gradient_ids` hold, per block, the swapper id of its f32 master chunk
  // and of its f32 gradient chunk, or are empty (none swapped). `inner`, `layout` and
  // `swapper` must outlive this.
  ZeroOffload(const ZeroConfig& config, const FlatLayout& layout, optim::Optimizer& inner,
              TensorSwapper& swapper, const std::vector<int64_t>& master_ids,
              const std::vector<int64_t>& gradient_ids);
  ZeroOffload(const ZeroOffload&) = delete;
  ZeroOffload& operator=(const ZeroOffload&) = delete;

  // One optimizer step, a sub-group at a time; `before_block(b)` and `after_block(b)` run
  // for each of a sub-group's blocks while it is in memory, before and after its update.
  void step(const std::function<void(int64_t block)>& before_block,
            const std::function<void(int64_t block)>& after_block);
  // Replaces the state with `chunk_state` (`inner`'s state_dict() form) a sub-group at a
  // time (SwappedOptimizerState::load); with `fill_block`, which writes block b's whole
  // master chunk (not read), fill_block(b) and then after_block(b) run for each of a
  // sub-group's blocks while it is in memory, before and after its state is made.
  void load(const StateDict& chunk_state, const std::function<void(int64_t block)>& fill_block,
            const std::function<void(int64_t block)>& after_block);
  // For TensorSwapper::read_each: the swapper id of state tensor `key`'s storage, and of
  // block `block`'s master chunk, or -1 where it is not swapped.
  int64_t state_id(const std::string& key) const { return state_->state_id(key); }
  int64_t master_id(int64_t block) const {
    return master_ids_.empty() ? -1 : master_ids_[static_cast<size_t>(block)];
  }
  TensorSwapper& swapper() const { return swapper_; }
  // SwappedOptimizerState::make_storages_resident (the masters) and swap_out_resident.
  void make_masters_resident() { state_->make_storages_resident(); }
  void swap_out_resident() { state_->swap_out_resident(); }
  // Bytes of the optimizer state and masters in memory now; bytes in the swap file only
  // (with the gradients written since backward, until the step discards them).
  int64_t resident_bytes() const { return state_->resident_bytes(); }
  int64_t swapped_bytes() const { return swapper_.swapped_bytes(); }

 private:
  std::vector<std::vector<int64_t>> blocks_;  // per sub-group
  std::vector<int64_t> master_ids_;           // per block, or empty
  TensorSwapper& swapper_;
  std::unique_ptr<SwappedOptimizerState> state_;
};

}  // namespace tessera::parallel
