// Where a ZeRO stage keeps the gradients and how it averages them over the data-parallel
// group (Note [ZeRO stages] in parallel/zero/zero_optimizer.h), one class per strategy:
//   AllReduceGradients      stage 0: a flat buffer, each block all-reduced
//   ReduceScatterGradients  stage 1: a flat buffer, each block reduce-scattered to its owner
//   BucketedGradients       stages 2-3: no full buffer; a block's gradients are gathered into
//                           a bucket as backward completes them, reduce-scattered, added to
//                           this rank's shard and dropped
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"
#include "parallel/zero/flat_layout.h"
#include "parallel/zero/zero_config.h"

namespace tessera::parallel {

class GradientReducer {
 public:
  // `params` (flat order of `layout`, all on `device`) and `layout` must outlive the reducer.
  GradientReducer(Communicator& dp, const FlatLayout& layout, std::vector<Tensor>& params,
                  Device device)
      : dp_(dp), layout_(layout), params_(params), device_(device) {}
  virtual ~GradientReducer() = default;
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Starts a step: the last step's gradients are discarded and the parameters' .grad set up
  // for backward to accumulate into.
  virtual void zero_grad() = 0;
  // Whether every micro-batch's backward reduces (its gradients are not kept whole).
  virtual bool reduces_every_micro_batch() const = 0;
  // Averages block `block`'s gradient over the group into this rank's part of it;
  // `communicate` false (a 1-bit optimizer's local step, stage 0 only) keeps the local one.
  virtual void reduce_block(int64_t block, bool communicate) = 0;
  // The averaged f32 gradient of this rank's chunk of `block` (what its optimizer steps).
  virtual Tensor own_chunk(int64_t block) const = 0;
  // This rank's share of the squared L2 norm of the averaged gradient: its own elements
  // (all of them when not sharded), leaving out parameters i with counted[i] false (empty:
  // every one counts).
  virtual double squared_norm(const std::vector<bool>& counted) const = 0;
  // Multiplies this rank's averaged gradient by `factor`.
  virtual void scale(double factor) = 0;
  // Whether a rank holds only its chunks of the averaged gradient (norms add over ranks).
  virtual bool sharded() const = 0;
  // Bytes of the gradient buffers this rank holds.
  virtual int64_t bytes() const = 0;

 protected:
  // The squared norm over this rank's chunks (the sharded strategies).
  double chunks_squared_norm(const std::vector<bool>& counted) const;
  void scale_chunks(double factor);
  // Averages `buffer` (a block's summed gradient, `chunk` x world elements) to this rank's
  // chunk: reduce-scattered, or all-reduced and narrowed (the sum, not yet divided).
  Tensor reduce_to_chunk(const Tensor& buffer, int64_t chunk, bool reduce_scatter) const;

  Communicator& dp_;
  const FlatLayout& layout_;
  std::vector<Tensor>& params_;
  Device device_;
};

// Stages 0-1: gradients accumulate in one flat f32 buffer of the layout (with f16/bf16
// parameters, in a flat 16-bit buffer, converted to f32 block by block at the reduction:
// Note [Mixed precision] in parallel/zero/zero_optimizer.h).
class FlatGradients : public GradientReducer {
 public:
  FlatGradients(Communicator& dp, const FlatLayout& layout, std::vector<Tensor>& params,
                DType dtype, Device device);
  void zero_grad() override;
  bool reduces_every_micro_batch() const override { return false; }
  Tensor own_chunk(int64_t block) const override;
  int64_t bytes() const override;
  // Parameter i's f32 gradient in the flat buffer (what a stage 0 optimizer steps).
  Tensor param_grad(int64_t i) const;

 protected:
  // Block `block`'s f32 gradient, converted from the 16-bit one when mixed.
  Tensor block_grad(int64_t block);

  Tensor flat_grads_;        // (layout.numel) f32
  Tensor flat_model_grads_;  // (layout.numel) 16-bit, with f16/bf16 parameters only
};

class AllReduceGradients final : public FlatGradients {
 public:
  using FlatGradients::FlatGradients;
  void reduce_block(int64_t block, bool communicate) override;
  double squared_norm(const std::vector<bool>& counted) const override;
  void scale(double factor) override;
  bool sharded() const override { return false; }
};

class ReduceScatterGradients final : public FlatGradients {
 public:
  ReduceScatterGradients(Communicator& dp, const FlatLayout& layout, std::vector<Tensor>& params,
                         DType dtype, Device device, bool reduce_scatter)
      : FlatGradients(dp, layout, params, dtype, device), reduce_scatter_(reduce_scatter) {}
  void reduce_block(int64_t block, bool communicate) override;
  double squared_norm(const std::vector<bool>& counted) const override {
    return chunks_squared_norm(counted);
  }
  void scale(double factor) override { scale_chunks(factor); }
  bool sharded() const override { return true; }

 private:
  bool reduce_scatter_;  // else all-reduce (ZeroConfig::reduce_scatter)
};

class BucketedGradients final : public GradientReducer {
 public:
  BucketedGradients(Communicator& dp, const FlatLayout& layout, std::vector<Tensor>& params,
                    Device device, bool reduce_scatter);
  void zero_grad() override;
  bool reduces_every_micro_batch() const override { return true; }
  void reduce_block(int64_t block, bool communicate) override;
  Tensor own_chunk(int64_t block) const override;
  double squared_norm(const std::vector<bool>& counted) const override {
    return chunks_squared_norm(counted);
  }
  void scale(double factor) override { scale_chunks(factor); }
  bool sharded() const override { return true; }
  int64_t bytes() const override { return static_cast<int64_t>(grad_shard_.nbytes()); }

 private:
  bool reduce_scatter_;
  Tensor grad_shard_;  // (layout.shard_numel()) f32: this rank's chunks, summed over micro-batches
};

}  // namespace tessera::parallel
