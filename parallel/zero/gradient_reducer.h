// Where a ZeRO stage keeps the gradients and how it averages them over the data-parallel
// group (Note [ZeRO stages] in parallel/zero/zero_optimizer.h), one class per strategy:
//   AllReduceGradients      stage 0: a flat buffer, each block all-reduced
//   ReduceScatterGradients  stage 1: a flat buffer, each block reduce-scattered to its owner
//                           (with 16-bit parameters, into an f32 shard)
//   BucketedGradients       stages 2-3: no full buffer; a block's gradients are gathered into
//                           a bucket as backward completes them, reduce-scattered, added to
//                           this rank's shard and dropped
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/async_collectives.h"
#include "parallel/comm/communicator.h"
#include "parallel/offload/tensor_swapper.h"
#include "parallel/zero/flat_layout.h"
#include "parallel/zero/zero_config.h"

namespace tessera::parallel {

// Note [Gradient averaging]
// A reduction averages the ranks' gradients by multiplying before it (pre) and after it
// (post), as DeepSpeed's engine does (deepspeed/runtime/engine.py, allreduce_bucket, and
// zero/stage_1_and_2.py, average_tensor):
//   16-bit communication, or prescale_gradients:  pre = 1 / W, post = 1
//   otherwise, with gradient_predivide_factor f:  pre = 1 / f, post = f / W  (f = 1: post only)
// Dividing first keeps an fp16 sum of W ranks from overflowing; the choice changes rounding
// only. W is the group's size, except for expert parameters, whose group is a part of the
// data group while their gradients average over all of it (mean_over: Note [Expert
// parameters] in zero_optimizer.h).
struct Averaging {
  DType communication = DType::f32;  // the dtype gradients are reduced in: f32, f16 or bf16
  bool prescale = false;             // prescale_gradients
  double predivide_factor = 1.0;     // gradient_predivide_factor (> 0)
  int mean_over = 0;                 // W; 0: the group's size
};

class GradientReducer {
 public:
  // `params` (flat order of `layout`, all on `device`) and `layout` must outlive the reducer.
  GradientReducer(Communicator& dp, const FlatLayout& layout, std::vector<Tensor>& params,
                  Device device, const Averaging& averaging)
      : dp_(dp), layout_(layout), params_(params), device_(device), averaging_(averaging) {}
  virtual ~GradientReducer() = default;
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Starts a step: the last step's gradients are discarded and the parameters' .grad set up
  // for backward to accumulate into.
  virtual void zero_grad() = 0;
  // Whether every micro-batch's backward reduces (its gradients are not kept whole).
  virtual bool reduces_every_micro_batch() const = 0;
  // After the backward of a micro-batch that does not reduce (not the step's last).
  virtual void end_micro_batch() {}
  // Averages block `block`'s gradient over the group into this rank's part of it;
  // `communicate` false (a 1-bit optimizer's local step, stage 0 only) keeps the local one.
  virtual void reduce_block(int64_t block, bool communicate) = 0;
  // Starts reducing the blocks reduce_block() collected for one coalesced reduction (Note
  // [Coalesced reductions]); call after the micro-batch's last reduce_block, before
  // finish_reductions(). A no-op for the strategies that reduce block by block.
  virtual void reduce_collected() {}
  // Forgets the collected blocks of a backward pass that failed: they were never started,
  // on this rank or (the failure being theirs too, or the group broken) on the others.
  virtual void drop_collected() {}
  // The averaged f32 gradient of this rank's chunk of `block` (what its optimizer steps).
  virtual Tensor own_chunk(int64_t block) const = 0;
  // This rank's share of the squared L2 norm of the averaged gradient: its own elements
  // (all of them when not sharded), leaving out parameters i with counted[i] false (empty:
  // every one counts). A 0-dim f64 tensor on the gradients' device, summed there in a fixed
  // order (on a GPU without a host read).
  virtual Tensor squared_norm(const std::vector<bool>& counted) const = 0;
  // Multiplies this rank's averaged gradient by `factor`.
  virtual void scale(double factor) = 0;
  // Call before the optimizer reads own_chunk(block): a swapped gradient (BucketedGradients
  // with NVMe offload) takes the factors scale() left for it.
  virtual void prepare_chunk(int64_t /*block*/) {}
  // Per block, the swapper id of its gradient chunk where the gradients live in a swap file
  // (Note [Swapped gradients]), else empty.
  virtual const std::vector<int64_t>& swap_ids() const;
  // Whether a rank holds only its chunks of the averaged gradient (norms add over ranks).
  virtual bool sharded() const = 0;
  // Bytes of the gradient buffers this rank holds.
  virtual int64_t bytes() const = 0;

  // Note [Overlapped reductions]
  // With `async` (overlap_comm), each reduction is started on the async
  // collectives' worker and reduce_block returns while it travels: the backward pass goes
  // on computing the next blocks. What follows a reduction (the post-scale, the add into
  // this rank's shard) runs when it is finished, in start order, by finish_reductions() or
  // before a block's buffer is made that would hold more than two buckets' elements in
  // flight (make_room: at most kMaxInFlight x reduce_bucket_size elements travel at once,
  // with the new one, or it and one other where it is larger, as DeepSpeed's
  // double-buffered buckets do). At
  // stage 3, where every parameter is its own block, that lets many small reductions
  // travel while backward computes; a count of blocks would stall it after two, waiting on
  // the worker behind the prefetched gathers. The operations,
  // their order and their arithmetic are the blocking ones, so the results are the same
  // bits. Until finish_reductions() returns, nothing else may use the group.
  // `bucket_numel`: reduce_bucket_size, the elements one bucket holds.
  void set_async(AsyncCollectives* async, int64_t bucket_numel);
  // Finishes every started reduction (a no-op without async): the gradients are then
  // complete. Rethrows the first failed reduction's error.
  void finish_reductions();
  // The most reductions, and the most elements of their buffers, travelling at once so far.
  struct InFlightPeak {
    int64_t reductions = 0;
    int64_t numel = 0;
  };
  InFlightPeak peak_in_flight() const { return peak_; }

 protected:
  // Finishes the oldest started reductions until `numel` more elements fit in flight (Note
  // [Overlapped reductions]): call before making a block's buffer of `numel` elements.
  void make_room(int64_t numel);
  // The squared norm over this rank's chunks (the sharded strategies).
  Tensor chunks_squared_norm(const std::vector<bool>& counted) const;
  void scale_chunks(double factor);
  // Calls f(i, piece) for each parameter i of `block` with elements in this rank's chunk
  // `own` of it, `piece` being those elements.
  void each_param_piece(int64_t block, const Tensor& own,
                        const std::function<void(int64_t, const Tensor&)>& f) const;
  // Averages `sum` (a block's gradient summed over this rank's micro-batches, `chunk` x
  // world elements, any floating dtype) over the group into `outs` (f32, one tensor): this
  // rank's chunk (`scatter`: reduce-scattered, or all-reduced and narrowed when
  // `reduce_scatter` is false) or the whole block; `add` adds instead of writing, and then
  // `outs` may be several tensors, taking consecutive parts of the `chunk` elements (Note
  // [Coalesced reductions]). The reduction runs in the communication dtype: `sum` itself
  // when of that dtype (it is then overwritten), else a converted copy, scaled as Note
  // [Gradient averaging] says. `then`, if given, runs once `outs` hold the result.
  void average_into(const Tensor& sum, const std::vector<Tensor>& outs, int64_t chunk, bool scatter,
                    bool reduce_scatter, bool add, const std::function<void()>& then = nullptr);

  Communicator& dp_;
  const FlatLayout& layout_;
  std::vector<Tensor>& params_;
  Device device_;
  Averaging averaging_;

 private:
  static constexpr size_t kMaxInFlight = 2;
  // A started reduction, its buffer's elements, and what completes it.
  struct InFlight {
    CommHandle handle;
    int64_t numel = 0;
    std::function<void()> finish;
  };
  // Waits for the oldest started reduction and completes it.
  void finish_oldest();

  AsyncCollectives* async_ = nullptr;
  std::deque<InFlight> in_flight_;
  int64_t in_flight_numel_ = 0;  // the elements of in_flight_'s buffers
  int64_t bucket_numel_ = 0;     // reduce_bucket_size
  InFlightPeak peak_;
};

// Stages 0-1: backward accumulates into one flat buffer of the layout in the parameters'
// dtype. With 16-bit parameters and f32 accumulation, each micro-batch that does not reduce
// adds that buffer into an f32 one and clears it (DeepSpeed's BF16_Optimizer), so the
// step's sum is taken in f32 (Note [Mixed precision] in parallel/zero/zero_optimizer.h).
class FlatGradients : public GradientReducer {
 public:
  // `accumulation`: the dtype the micro-batches' gradients are summed in (f32 or `dtype`).
  FlatGradients(Communicator& dp, const FlatLayout& layout, std::vector<Tensor>& params,
                DType dtype, DType accumulation, const Averaging& averaging, Device device);
  void zero_grad() override;
  bool reduces_every_micro_batch() const override { return false; }
  void end_micro_batch() override;
  int64_t bytes() const override;

 protected:
  // Block `block`'s gradient summed over the step's micro-batches: a view of f32_sum_
  // (after adding the last micro-batch into it) or of the model's gradients.
  Tensor block_sum(int64_t block);

  Tensor model_grads_;     // (layout.numel) in the parameters' dtype: the .grad views
  bool f32_accumulation_;  // of 16-bit gradients
  // (layout.numel) f32: the sum of this step's earlier micro-batches with f32 accumulation
  // (made at the first one), and stage 0's averaged gradient with 16-bit parameters (made
  // at construction); else undefined.
  Tensor f32_sum_;
  bool summed_ = false;  // f32_sum_ holds earlier micro-batches of this step
};

// Stage 0: every rank averages every block, into a flat f32 buffer (the model's gradients
// themselves with f32 parameters), which the optimizer steps.
class AllReduceGradients final : public FlatGradients {
 public:
  AllReduceGradients(Communicator& dp, const FlatLayout& layout, std::vector<Tensor>& params,
                     DType dtype, DType accumulation, const Averaging& averaging, Device device);
  void reduce_block(int64_t block, bool communicate) override;
  Tensor own_chunk(int64_t block) const override;
  Tensor squared_norm(const std::vector<bool>& counted) const override;
  void scale(double factor) override;
  bool sharded() const override { return false; }
  // Parameter i's averaged f32 gradient (what a stage 0 optimizer steps).
  Tensor param_grad(int64_t i) const;

 private:
  Tensor averaged_;  // (layout.numel) f32: f32_sum() with 16-bit parameters, else model_grads_
};

// Stage 1: each block is reduce-scattered to its owner. With f32 parameters a rank's chunks
// are views of the model's gradient buffer; with 16-bit ones they are an f32 shard.
class ReduceScatterGradients final : public FlatGradients {
 public:
  ReduceScatterGradients(Communicator& dp, const FlatLayout& layout, std::vector<Tensor>& params,
                         DType dtype, DType accumulation, const Averaging& averaging, Device device,
                         bool reduce_scatter);
  void reduce_block(int64_t block, bool communicate) override;
  Tensor own_chunk(int64_t block) const override;
  Tensor squared_norm(const std::vector<bool>& counted) const override {
    return chunks_squared_norm(counted);
  }
  void scale(double factor) override { scale_chunks(factor); }
  bool sharded() const override { return true; }
  int64_t bytes() const override;

 private:
  bool reduce_scatter_;  // else all-reduce (ZeroConfig::reduce_scatter)
  Tensor grad_shard_;    // (layout.shard_numel()) f32, with 16-bit parameters
};

// Note [Coalesced reductions]
// At stage 3 every parameter is its own block (Note [ZeRO-3 parameters]), so reducing
// block by block would make one collective per parameter, a hundred small operations per
// micro-batch for a GPT, each paying the link's latency and a meeting of the ranks. As
// DeepSpeed's stage 3 collects gradients in its reduce bucket and reduce-scatters them
// together (deepspeed/runtime/zero/stage3.py, reduce_scatter_coalesced), blocks smaller
// than reduce_bucket_size are collected as their gradients complete until the bucket is
// full, or reduce_collected() is called at the end of backward, and go in one operation
// over a buffer laid out rank by rank,
//   [rank 0's chunk of each block | rank 1's chunk of each block | ...],
// so that rank r receives its chunks of all of them, adjacent, and adds each into its
// shard. Every element is summed over the same ranks as block by block; the operations'
// order is the order gradients complete, the same on every rank. Blocks of the bucket's
// size or larger are reduced alone, as they arrive, and so are all of stage 2's, whose
// blocks are cut at the bucket's size already. The cost: the collected gradients and, for
// a moment, their rank-major copy (each freed as it is copied): up to twice the bucket.
//
// Note [Swapped gradients]
// With NVMe offload each block's chunk of the shard is a storage of its own in the optimizer
// state's swap file (Note [ZeRO's offloaded state] in parallel/zero/zero_offload.h): a
// reduction brings its blocks' chunks in (zeros after zero_grad(), without reading), adds
// and writes them back, keeping the squares of what it wrote for squared_norm(), which sums
// them as it would have summed the chunks. scale() records its factor; prepare_chunk()
// applies the recorded factors to a chunk the step brought in. The same arithmetic in the
// same order, so the step sees the in-memory run's bits.
class BucketedGradients final : public GradientReducer {
 public:
  // Blocks of fewer than `coalesce_below` elements are coalesced (Note [Coalesced
  // reductions]): reduce_bucket_size at stage 3, 0 (none) at stage 2. With `swapper` (host
  // gradients only; it must outlive this) the shard lives in its file (Note [Swapped
  // gradients]).
  BucketedGradients(Communicator& dp, const FlatLayout& layout, std::vector<Tensor>& params,
                    const Averaging& averaging, Device device, bool reduce_scatter,
                    int64_t coalesce_below, TensorSwapper* swapper = nullptr);
  void zero_grad() override;
  bool reduces_every_micro_batch() const override { return true; }
  void reduce_block(int64_t block, bool communicate) override;
  void reduce_collected() override;
  void drop_collected() override;
  Tensor own_chunk(int64_t block) const override;
  Tensor squared_norm(const std::vector<bool>& counted) const override;
  void scale(double factor) override;
  void prepare_chunk(int64_t block) override;
  bool sharded() const override { return true; }
  int64_t bytes() const override;
  const std::vector<int64_t>& swap_ids() const override { return swap_ids_; }

 private:
  // Block `block`'s gradient in one buffer (block numel, the wire's dtype), dropped from
  // the parameters.
  Tensor take_gradient(int64_t block);
  // Swapped gradients: brings `blocks`' chunks in for a reduction into them, and the
  // function that writes them back once it is done.
  std::function<void()> bring_in(const std::vector<int64_t>& blocks);

  bool reduce_scatter_;
  int64_t coalesce_below_;
  Tensor grad_shard_;  // (layout.shard_numel()) f32: this rank's chunks, summed over micro-batches
  // Swapped gradients (Note [Swapped gradients]), else empty: per block its chunk (f32, a
  // storage of its own), its swapper id, and the squares of its chunk as last written,
  // whole and per parameter piece (each_param_piece's order); the factors scale() left.
  TensorSwapper* swapper_ = nullptr;
  std::vector<Tensor> chunks_;
  std::vector<int64_t> swap_ids_;
  struct Squares {
    double whole = 0.0;
    std::vector<std::pair<int64_t, double>> pieces;  // (parameter, squares)
  };
  std::vector<Squares> squares_;
  std::vector<double> pending_scales_;
  // Blocks waiting for a coalesced reduction, with their gradients, and their elements.
  std::vector<std::pair<int64_t, Tensor>> collected_;
  int64_t collected_numel_ = 0;
};

}  // namespace tessera::parallel
