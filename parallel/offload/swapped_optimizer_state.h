// SwappedOptimizerState: an optimizer whose state lives in a swap file between steps and
// comes into memory one sub-group at a time, ZeRO-Infinity's optimizer swapper
// (deepspeed/runtime/swap_tensor/partitioned_optimizer_swapper.py).
//
// Note [Offloaded optimizer state]
// The optimizer's parameters are split into sub-groups (DeepSpeed's sub_group_size tiles of
// the fp32 partition). Between steps every sub-group's state (Adam's moments, SGD's
// momentum) and the storages given with it (its f32 masters, where they have storages of
// their own) are in the swap file (parallel/offload/tensor_swapper.h), and so may be its
// gradients, which their owner writes there. step() waits for the writes in flight (the
// gradients'), then goes sub-group by sub-group: swap in
// (the gradients too), call the caller's `before` (to scale the gradients), update (Note [A
// step in parts] in optim/optimizer.h), call its `after` while the sub-group is in memory
// (to round its masters into the 16-bit model), swap the state out and discard the
// gradients, and wait for the writes; then the step ends. So besides the swapper's buffers
// at most one sub-group's state is in memory, and the parameters come out as step()'s bits.
// DeepSpeed's pipelining (its PipelinedOptimizerSwapper) trades memory for overlap, and
// changes no bits: with `read_ahead` (offload_optimizer.pipeline_read) the next sub-group's
// reads are started before the current one's update, and with `write_behind`
// (pipeline_write) a sub-group's writes are waited for only after the next sub-group's
// update, which they overlap (the last one's go on during the next forward pass, its memory
// released as they complete): with both, up to three sub-groups are in memory, the one
// updated, the one before it leaving and the one after it arriving. The optimizer makes a
// state tensor at its first use, so the first step swaps each sub-group's new state out
// after updating it; the given storages in memory go out at construction. A checkpoint
// reads the state a storage at a time (state_id() names each tensor's storage for
// TensorSwapper::read_each), and load() replaces it the way a step goes, a sub-group at a
// time. Anything else that reads or writes the given storages (the masters, whole) first
// calls make_storages_resident(), which holds them all in memory until swap_out_resident()
// or the next step swaps each sub-group out again.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "optim/optimizer.h"
#include "parallel/offload/tensor_swapper.h"

namespace tessera::parallel {

// DeepSpeed's offload_optimizer.pipeline_read and pipeline_write (Note [Offloaded optimizer
// state]).
struct SwapPipelining {
  bool read_ahead = false;
  bool write_behind = false;
};

class SwappedOptimizerState {
 public:
  struct SubGroup {
    std::vector<std::string> params;  // names of the optimizer's parameters
    // Swapper ids: storages swapped with the state (f32 masters), and the gradients the
    // update reads, discarded after it.
    std::vector<int64_t> storages;
    std::vector<int64_t> gradients;
  };
  // `optimizer` (supports_parts()) and the swapper must outlive this; every parameter of
  // the optimizer is in exactly one sub-group. Swaps the sub-groups' storages out where
  // they are in memory.
  SwappedOptimizerState(optim::Optimizer& optimizer, std::vector<SubGroup> sub_groups,
                        TensorSwapper& swapper, SwapPipelining pipelining = {});

  // One optimizer step, a sub-group at a time (Note [Offloaded optimizer state]);
  // `before(g)` and `after(g)` run while sub-group g is in memory, before and after its
  // update.
  void step(const std::function<void(size_t)>& before, const std::function<void(size_t)>& after);
  // Replaces the optimizer's state with `saved` (Optimizer::load_state_dict's form, all of
  // it checked first), a sub-group at a time: with `fill`, brings its given storages in as
  // zeros (no read) and calls `fill(g)` to write all of them; makes its state from `saved`;
  // with `fill`, calls `after(g)`; and swaps out its state and whichever of its storages
  // are in memory (without `fill` they are not read). So besides the swapper's buffers one
  // sub-group is in memory, and `saved` may be a mapped file's (Note [Mapped tensors] in
  // models/io/safetensors.h).
  void load(const StateDict& saved, const std::function<void(size_t)>& fill,
            const std::function<void(size_t)>& after);
  // The swapper id of the storage of state tensor `key` ("<kind>.<parameter name>"), or -1
  // where it has none (not made yet).
  int64_t state_id(const std::string& key) const;
  // Brings every sub-group's given storages (not its state) into memory, until the next
  // step or swap_out_resident().
  void make_storages_resident();
  // Sends what is in memory back to the swap file (after the parameters were read, say).
  void swap_out_resident();
  // Bytes of the sub-groups' state and storages in memory now (not the gradients).
  int64_t resident_bytes() const;

 private:
  struct Group {
    std::set<std::string> params;  // the sub-group's parameter names
    std::vector<int64_t> ids;      // swapper ids: the storages, then the state once it exists
    size_t storage_ids = 0;        // how many of ids are the given storages'
    std::vector<int64_t> gradients;
    bool state_known = false;
  };
  // Registers the state tensors the optimizer made for group g.
  void add_state(Group& g);
  // Drops group g's state from the swapper (before a load replaces it): its memory goes,
  // its regions stay unused in the file.
  void forget_state(Group& g);
  // Those of `ids` that are out of memory.
  std::vector<int64_t> swapped_out(const std::vector<int64_t>& ids) const;

  optim::Optimizer& optimizer_;
  TensorSwapper& swapper_;
  SwapPipelining pipelining_;
  std::vector<Group> groups_;
  std::map<std::string, int64_t> state_ids_;  // state key -> swapper id
};

}  // namespace tessera::parallel
