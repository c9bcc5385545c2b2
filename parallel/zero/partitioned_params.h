// PartitionedParams: ZeRO stage 3's parameters, each rank holding 1/W of every one and
// gathering whole parameters only around the module calls that read them.
//
// Note [ZeRO-3 parameters]
// The layout has one block per parameter (make_flat_layout with block_numel 1): every
// parameter is padded to a multiple of W and rank r owns chunk r of it, in this rank's
// fp32 shard (one chunk per parameter: views of one buffer, or storages of their own that
// NVMe offload swaps). With 16-bit parameters that shard holds their f32 masters, and a 16-bit
// copy of it, rounded after each step, is what the gathers send (DeepSpeed's ds_tensor). Each
// parameter tensor views its own gather storage (core/storage.h), the padded parameter, which is
// allocated and all-gathered from the shards when the parameter is needed and released after;
// autograd nodes that saved the parameter keep a handle of the same storage, so they see it
// gathered again before their backward runs.
//
// Installed as the model's ModuleHooks:
//   pre_forward(m)   gathers m's own parameters and pins them for the call, then
//                    prefetches the parameters of the next calls along the recorded trace
//                    (the module calls of the first forward): the next calls'
//                    parameters, up to stage3_prefetch_bucket_size elements of them;
//   post_forward(m)  unpins them; each is released unless the trace shows it read again
//                    within stage3_max_reuse_distance elements of gathering;
//   pre_backward(m)  gathers m's parameters again and pins them until their gradient has
//                    been accumulated (grad_ready), prefetching along the trace reversed.
// Parameters of at most stage3_param_persistence_threshold elements are persistent: kept
// whole on every rank, all-gathered after each step, never released. The gathered
// elements of the others never exceed stage3_max_live_parameters: prefetched and retained
// parameters are dropped first, and a call that needs more than the bound on its own is an
// error. With async collectives (set_async: overlap_comm, DeepSpeed's default at stage 3)
// every gather is started on their worker and waited for only where the parameter is used
// or released, so a prefetched parameter travels while the calls before it compute; all
// gathers and the gradient reductions share that worker, so every rank issues them in one
// order. Without, the gathers block and prefetching bounds their number only.
//
// Note [Offloaded parameters]
// With offload_param "nvme" (ZeRO-Infinity; 16-bit parameters), each non-persistent
// parameter's chunk of the 16-bit shard is a storage of its own in a swap file of the
// parameters' own (parallel/offload/tensor_swapper.h). It is written there at construction,
// read in just before its gather starts, and let go without a write once the gather has
// sent it (the file holds it unchanged); the step's rounding makes it anew, with no read,
// and writes it. Of the parameters, what stays in memory is then the persistent ones, the
// gathered ones (stage3_max_live_parameters bounds them) and the swapper's buffers. f32
// parameters have no 16-bit shard: their f32 shard, the optimizer's masters, is what the
// gathers send, so with offload_param "nvme" it lives in the optimizer's swap file
// (offload_optimizer "nvme" is required) and each gather brings its chunk in the same way
// (gather_from_swapped_shard; persistent parameters' chunks too, for their gathers after
// the step). On a GPU
// the shard is host memory ("cpu") or the swap file ("nvme"), and each gather sends a copy
// of the chunk made on the device just before it starts (gather_source): the device holds
// only the gathered parameters (Note [Offload on a GPU] in zero_optimizer.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "autograd/module.h"
#include "core/tensor.h"
#include "parallel/comm/async_collectives.h"
#include "parallel/comm/communicator.h"
#include "parallel/offload/tensor_swapper.h"
#include "parallel/zero/flat_layout.h"
#include "parallel/zero/zero_config.h"

namespace tessera::parallel {

// Writes parameter `name`'s initial value into `out` (f32, the parameter's shape): a model's
// init_parameter (Note [Partitioned construction] in autograd/module.h).
using ParameterInit = std::function<void(const std::string& name, const Tensor& out)>;

// Calls around construction's write of parameter i's f32 chunk: `before(i)` makes it
// writable, `after(i)` takes it once written (NVMe offload brings it into memory and swaps
// it out: Note [ZeRO's offloaded state] in parallel/zero/zero_offload.h). Either may be
// empty.
struct ShardWrites {
  std::function<void(int64_t)> before;
  std::function<void(int64_t)> after;
};

// dst = master, rounded to dst's dtype (a 16-bit chunk from its f32 master). With `staging`
// defined (pinned host memory) and a CUDA `dst` written from a host master, the conversion
// goes through it and the copy is queued (Tensor::copy_queued_); otherwise copy_.
void round_into(const Tensor& dst, const Tensor& master, const Tensor& staging);

class PartitionedParams final : public ModuleHooks {
 public:
  // `params` in the flat order of `layout` (one block per parameter), of one dtype (f32,
  // f16 or bf16), holding the same values on every rank. Copies this rank's chunk of
  // parameter i into `shard[i]` (f32, block i's chunk elements; with 16-bit parameters their
  // f32 masters, rounded into a 16-bit shard that the gathers send), with `writes` around
  // each copy, and points each parameter at its gather storage: persistent ones gathered,
  // the others released. Parameters that are not materialized (built under a
  // DeferredInitGuard) take their values from `init`, one at a time, on every rank alike;
  // the others are rank 0's. With `chunk_swapper` (16-bit parameters; it must outlive this)
  // the non-persistent parameters' 16-bit chunks live in its file (Note [Offloaded
  // parameters]); `host_chunks` (a GPU run's offload_param) keeps the 16-bit shard in host
  // memory (`pinned`: pinned memory), copied to the device for each gather (Note [Offload on
  // a GPU] in zero_optimizer.h).
  PartitionedParams(Communicator& dp, const FlatLayout& layout, std::vector<Tensor> params,
                    std::vector<Tensor> shard, const ZeroConfig& config, const ParameterInit& init,
                    const ShardWrites& writes = {}, TensorSwapper* chunk_swapper = nullptr,
                    bool host_chunks = false, bool pinned = false);

  void pre_forward(const Module& m) override;
  void post_forward(const Module& m) noexcept override;
  void pre_backward(const Module& m) override;

  // Backward is starting: the trace of the forwards so far is complete.
  void begin_backward();
  // Parameter `i`'s gradient has been accumulated and reduced: it may be released.
  void grad_ready(int64_t i);
  // Backward is over: every non-persistent parameter is released.
  void end_backward();
  // The shard was updated: persistent parameters are gathered again, the others released.
  // With 16-bit parameters the f32 masters are rounded into the 16-bit shard first, unless
  // round_chunks_in_step() moved that into the step.
  void after_step();
  // 16-bit parameters: the step rounds each updated chunk itself, with round_chunk(i), while
  // it is in memory (NVMe offload), and after_step() rounds none.
  void round_chunks_in_step() { rounded_in_step_ = true; }
  bool rounds_in_step() const { return rounded_in_step_; }
  // Rounds parameter i's f32 master chunk into the 16-bit shard (round_into).
  void round_chunk(int64_t i, const Tensor& staging);
  // Replaces every parameter's value from whole tensors (flat order), on every rank alike.
  void load(const std::vector<Tensor>& whole);
  // The whole value of every parameter (flat order), gathered one at a time. Collective.
  std::vector<Tensor> gather_all();

  // Starts the gathers on `async` (which must outlive this object) from now on and waits
  // for them where needed (Note [ZeRO-3 parameters]); null: blocking gathers.
  void set_async(AsyncCollectives* async);

  // Waits for every travelling gather, all of them even when one failed; then rethrows the
  // first failure.
  void settle_all();

  bool persistent(int64_t i) const { return persistent_[i]; }
  bool gathered(int64_t i) const { return live_[i]; }
  // Elements of non-persistent parameters gathered now, and the most at any time.
  int64_t live_numel() const { return live_numel_; }
  int64_t peak_live_numel() const { return peak_live_numel_; }
  // Bytes held besides the f32 shard: the 16-bit shard (its chunks in memory) and the
  // persistent parameters' whole copies.
  int64_t bytes() const;
  // Of those, the 16-bit shard's; and of that, what is host memory on a GPU run (0 on the
  // CPU).
  int64_t chunk_bytes() const;
  int64_t host_chunk_bytes() const;
  // f32 parameters whose shard chunks are `swapper`'s storages `ids` (one per parameter: the
  // optimizer's masters with offload_param "nvme", Note [Offloaded parameters]): each gather
  // brings its chunk in and lets it go, as for a swapped 16-bit chunk. `swapper` must outlive
  // this.
  void gather_from_swapped_shard(TensorSwapper& swapper, const std::vector<int64_t>& ids);
  // Bytes of the 16-bit shard in the swap file only (Note [Offloaded parameters]).
  int64_t swapped_bytes() const;

 private:
  // The non-persistent parameters among m's own (looked up once per module).
  const std::vector<int64_t>& params_of(const Module& m);
  // Starts gathering parameter i unless it is live; without async collectives the gather is
  // done on return, with them settle(i) waits for it.
  void start_fetch(int64_t i);
  // Waits for parameter i's gather if one is travelling.
  void settle(int64_t i);
  void release(int64_t i);
  // Makes room for `numel` more live elements by releasing unpinned parameters; false
  // when the bound cannot be met.
  bool make_room(int64_t numel);
  // Parameter i's chunk the gathers send: of the 16-bit shard, or of the f32 one.
  Tensor source_chunk(int64_t i) const;
  // source_chunk(i) on the parameters' device: itself, or (a host chunk) a copy, after which
  // a swapped chunk is let go.
  Tensor gather_source(int64_t i);
  // Brings parameter i's swapped 16-bit chunk in for a gather, and lets it go once the
  // gather has sent it (no-ops for chunks that stay in memory).
  void chunk_in(int64_t i);
  void chunk_sent(int64_t i);
  // Gathers `ids` and pins them (forward or backward pin).
  void fetch_pinned(const Module& m, const std::vector<int64_t>& ids, bool backward);
  // Prefetches along the trace from position `from`, stepping by `dir` (+1 or -1).
  void prefetch(int64_t from, int dir);
  // Whether parameter i is read again within the reuse distance after trace position pos.
  bool reused_soon(int64_t i, int64_t pos);

  Communicator& dp_;
  AsyncCollectives* async_ = nullptr;
  std::vector<CommHandle> gathering_;  // per parameter: its travelling gather, if any
  const FlatLayout& layout_;
  ZeroConfig config_;
  std::vector<Tensor> params_;
  // Per parameter, (its block's chunk) f32: its chunk, or its master's.
  std::vector<Tensor> shard_;
  Tensor model_shard_;  // (layout.shard_numel()) f16/bf16, with 16-bit parameters only
  // Per parameter, (its block's chunk) of the 16-bit shard: views of model_shard_, or with
  // a chunk swapper storages of their own.
  std::vector<Tensor> model_chunks_;
  TensorSwapper* chunk_swapper_ = nullptr;
  std::vector<int64_t> chunk_ids_;  // per parameter: its chunk's swapper id, or -1
  std::vector<bool> chunk_held_;    // per parameter: its swapped chunk is in for a gather
  bool rounded_in_step_ = false;
  bool gathers_read_masters_ = false;  // gather_from_swapped_shard()
  std::vector<Tensor> gather_;  // per parameter: (block numel), sharing the parameter's storage
  std::vector<bool> persistent_;
  std::vector<bool> live_;
  std::vector<int> forward_pins_;
  std::vector<bool> backward_pinned_;
  int64_t live_numel_ = 0;
  int64_t peak_live_numel_ = 0;

  std::map<const TensorImpl*, int64_t> index_;  // parameter -> flat index
  std::map<const Module*, std::vector<int64_t>> module_params_;
  // Module calls of the first forward, in order; complete at the first backward.
  std::vector<const Module*> trace_;
  bool trace_complete_ = false;
  int64_t forward_pos_ = -1;  // the trace position of the current forward call
  int64_t backward_pos_ = 0;  // where the next pre_backward is looked for, backwards
  bool in_backward_ = false;
};

}  // namespace tessera::parallel
