// The GPT-2 language model, with Hugging Face parameter names.
//
//   Gpt model(GptConfig::preset("gpt2"), /*seed=*/1337);
//   Tensor logits = model.forward(idx);           // (B, T) -> (B, T, Vp)
//   Tensor loss = model.loss(logits, targets);     // mean cross-entropy
//
// Parameters: transformer.wte.weight (Vp, C), transformer.wpe.weight (block_size, C),
// transformer.h.{i}.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}.*,
// transformer.ln_f.*, and lm_head.weight (Vp, C) only when the head is not tied. Linear
// weights use the (out, in) layout; models/gpt2/hf_weights.h converts to Hugging Face's
// transposed Conv1D layout.
//
// Note [Tensor-parallel GPT]
// With a model-parallel group of P ranks, each rank holds Megatron-LM's slices
// (megatron/core/tensor_parallel/layers.py): c_attn and mlp.c_fc are column-parallel (each
// rank computes its H / P heads and its 4C / P hidden units), attn.c_proj and mlp.c_proj
// row-parallel (their partial outputs summed over the group), wte vocab-parallel (Vp / P
// rows each; a token outside a rank's rows embeds to zero there and the sum restores it),
// and the head column-parallel over the vocabulary, its loss the vocabulary-parallel
// cross-entropy (parallel/tensor/cross_entropy.h). LayerNorms, wpe and biases of
// row-parallel layers are replicated. Every rank draws the whole parameter from the same
// (seed, name) stream and keeps its slice, so a sliced model equals the dense one, except
// that in training each rank drops its own heads' attention probabilities with masks of
// its own (Note [Model-parallel dropout] in parallel/tensor/dropout_streams.h).
//
// Note [Pipeline GPT]
// A pipeline stage holds a GptPart (models/gpt2/pipeline_part.h): the first stage the
// embedding (wte, wpe, dropout), each stage a run of blocks, the last ln_f and the head. A
// tied head keeps a copy of wte on the last stage; both stages list it in
// tied_parameter_names(), and the engine sums the two copies' gradients before the
// optimizer steps (DeepSpeed's ReduceTiedGrads; parallel/engine/model_stage.h).
// forward_stage() runs one stage: token ids or activations in, activations or logits out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autograd/module.h"
#include "core/philox.h"
#include "models/gpt2/batch_split.h"
#include "models/gpt2/block.h"
#include "models/gpt2/config.h"
#include "models/gpt2/kv_cache.h"
#include "models/gpt2/pipeline_part.h"
#include "models/language_model.h"
#include "models/layers/dropout.h"
#include "models/layers/embedding.h"
#include "models/layers/layer_norm.h"
#include "parallel/comm/communicator.h"
#include "parallel/layer_drop.h"
#include "parallel/tensor/dropout_streams.h"
#include "parallel/tensor/layers.h"

namespace tessera {

class Gpt : public LanguageModel {
 public:
  // Builds the model and initializes its materialized parameters (all of them, unless
  // built under a DeferredInitGuard) with init_parameter(); dropout masks come from
  // Philox streams keyed by `seed`, the first block `part` holds and, for the attention
  // probabilities, the tensor-parallel rank (Note [Model-parallel dropout] in
  // parallel/tensor/dropout_streams.h). With `model_group` the
  // weights are split over it (Note [Tensor-parallel GPT]); the group must outlive the model.
  // Throws when n_head or the padded vocabulary does not split over the group. `part` builds one
  // pipeline stage's layers only (Note [Pipeline GPT]).
  // With `overlap_comm` and a model group of several ranks, the column-parallel products
  // (c_attn, c_fc, the head) sum their input gradients over the group while computing their
  // weight gradients, through the model's own async collectives over the group (Note
  // [Overlapped input gradients] in parallel/tensor/layers.h; Megatron's default): a worker
  // thread on thread ranks and MPI with MPI_THREAD_MULTIPLE, NCCL's stream on CUDA; host
  // staging and MPI without it sum at once.
  // With `expert_group` (an expert-parallel group: parallel/expert/expert_groups.h) each MoE
  // block holds its share of the experts (Note [Expert parallelism] in
  // models/moe/moe_layer.h); the group must outlive the model.
  Gpt(const GptConfig& cfg, uint64_t seed, parallel::Communicator* model_group = nullptr,
      const GptPart& part = {}, bool overlap_comm = true,
      parallel::Communicator* expert_group = nullptr);

  // GPT-2 initialization, a function of (seed, parameter name) only: N(0, 0.02) for
  // weights and embeddings, N(0, 0.02 / sqrt(2 n_layer)) for the residual projections
  // (attn.c_proj.weight, mlp.c_proj.weight), LayerNorm weight 1, biases 0, and zero
  // rows for the vocabulary padding. Drawn on each parameter's full logical shape; a
  // tensor-parallel rank keeps its slice.
  void init_parameter(const std::string& name, const Tensor& out) const override;

  // (B, T) i32|i64 -> logits (B, T, Vp / P): this rank's vocabulary slice (all of it when
  // P = 1). Needs the whole model.
  Tensor forward(const Tensor& idx) const override;
  // This stage's layers: token ids (B, T) when it holds the embedding, else the previous
  // stage's (B, T, C); returns the logits when it holds the head, else (B, T, C).
  Tensor forward_stage(const Tensor& input) const override;
  // Mean cross-entropy over the first vocab_size logits (padding is never predicted), from
  // forward()'s logits, plus, in training, moe.aux_loss_coef times the MoE blocks'
  // load-balancing losses of the latest forward (an evaluation reports the language model's
  // loss alone, as Megatron-DeepSpeed's "lm loss"). Collective over the model group. Needs
  // the head.
  Tensor loss(const Tensor& logits,
              const Tensor& targets) const override;  // (B, T, Vp/P), (B, T) -> ()
  // Inference: logits of the new positions idx (B, T) placed after the cache's contents,
  // whose keys and values it appends. No graph is recorded. Needs P = 1.
  Tensor forward_cached(const Tensor& idx, KvCache& cache) const;  // -> (B, T, Vp)

  // Recompute blocks in backward instead of storing their activations: every `interval`
  // consecutive blocks form one checkpoint (0: none; 1, or true: each block).
  // With MoE blocks each segment also returns its blocks' load-balancing losses, which
  // loss() adds, so their gradient reaches the gates through the recomputation.
  void set_activation_checkpointing(int64_t interval, CheckpointPolicy policy = {}) override {
    checkpoint_interval_ = interval;
    checkpoint_policy_ = std::move(policy);
  }

  // Cuts each forward's activations into `pieces` along the batch dim around the blocks, so
  // that one piece's tensor-parallel sums travel while another piece computes (Note
  // [Batch-split overlap] in models/gpt2/batch_split.h; 1: whole batches). Throws for
  // pieces > 1 unless the model was built with a model group of several ranks and
  // `overlap_comm`, or when it has MoE blocks.
  void set_batch_split(int64_t pieces);

  // Pipelines (forward_stage) and tensor slicing (a model group).
  static constexpr parallel::ModelCapabilities kCapabilities{true, true};
  parallel::ModelCapabilities capabilities() const override { return kCapabilities; }
  // {"transformer.wte.weight"} on the two stages of a pipeline that hold wte when the head
  // is tied (Note [Pipeline GPT]); empty otherwise.
  std::vector<std::string> tied_parameter_names() const override;

  const GptConfig& config() const { return cfg_; }
  // The MoE blocks' load-balancing losses and routing of the latest forward, in block order
  // (Note [GPT-MoE] in moe_config.h; their outputs undefined); empty without MoE.
  const std::vector<moe::MoeOutput>& moe_outputs() const { return moe_outputs_; }
  std::vector<parallel::ExpertLoad> take_expert_load() override;
  // The experts' parameters: "transformer.h.<i>.mlp.experts.<e>.*".
  bool is_expert_parameter(const std::string& name) const override;
  // Each MoE block's experts (this rank's share of them).
  std::vector<Module*> expert_modules() override;
  // A pipeline stage without the head, in training: moe.aux_loss_coef times its MoE blocks'
  // load-balancing losses of the latest forward (Note [GPT-MoE] in moe_config.h).
  Tensor stage_extra_loss() const override;
  // The layers this model holds (all of them unless built as a pipeline stage).
  const GptPart& part() const { return part_; }
  // The tensor-parallel group (of one without one given).
  parallel::Communicator& model_group() const { return model_group_; }
  // The dropout streams; the engine keys them per step (Note [Dropout per step] in
  // parallel/engine/engine.h).
  parallel::DropoutStreams& dropout_streams() override { return dropout_streams_; }
  void wait_for_communication() override {
    if (model_async_) model_async_->wait_all();
  }
  // Progressive layer drop in training forwards (Note [Progressive layer drop] in
  // parallel/layer_drop.h), keyed by the initialization seed; not with activation
  // checkpointing or MoE blocks (a recomputation would draw again; a skipped MoE block would
  // leave its gate's counts out).
  void set_layer_drop(double theta, int64_t step) override;

 private:
  // The "transformer" child: embeddings, blocks and the final LayerNorm, those `part` holds
  // (wte also on a stage with a tied head).
  struct Transformer : Module {
    Transformer(const GptConfig& cfg, const GptPart& part, parallel::DropoutStreams& streams,
                parallel::Communicator& model_group, parallel::AsyncCollectives* async,
                parallel::Communicator* expert_group);
    std::unique_ptr<parallel::VocabParallelEmbedding> wte;
    std::unique_ptr<Embedding> wpe;
    std::unique_ptr<Dropout> drop;
    ModuleList h;
    std::unique_ptr<LayerNorm> ln_f;
  };

  // Throws unless this model holds `what` (`has`), naming the part it holds.
  void require(bool has, const char* what) const;
  // init_parameter() for a parameter whose placement is known.
  void init_value(const std::string& name, const Placement& placement, const Tensor& out) const;

  Tensor embed(const Tensor& idx, int64_t start) const;  // (B, T) -> (B, T, C)
  Tensor head(const Tensor& x) const;                    // (B, T, C) -> (B, T, Vp / P)
  Tensor blocks(Tensor x) const;                         // (B, T, C) -> (B, T, C)
  // blocks() for an MoE model with activation checkpointing: each segment's outputs are its
  // last block's and its MoE blocks' load-balancing losses.
  Tensor checkpointed_moe_blocks(Tensor x) const;
  // blocks() with batch_pieces_ > 1 (Note [Batch-split overlap]).
  Tensor batch_split_blocks(Tensor x) const;
  // A training forward's blocks under progressive layer drop: those kept, with their divisors.
  std::vector<BlockCall> kept_blocks() const;
  // aux_loss_coef times the sum of the latest forward's load-balancing losses, as a scalar
  // of `dtype`; undefined without any.
  Tensor aux_term(DType dtype) const;
  // Adds the latest training forward's gate results to expert_load_.
  void count_expert_load() const;
  const Block& block(size_t i) const { return static_cast<const Block&>(transformer_.h[i]); }
  Block& block(size_t i) { return static_cast<Block&>(transformer_.h[i]); }

  GptConfig cfg_;
  uint64_t seed_;  // of the initialization
  GptPart part_;
  std::unique_ptr<parallel::Communicator> own_group_;  // the group of one, when none is given
  parallel::Communicator& model_group_;
  // The model group's async collectives (overlap_comm with several ranks), else null.
  std::unique_ptr<parallel::AsyncCollectives> model_async_;
  // Mutable: a forward pass in training draws dropout masks (the layers hold pointers).
  mutable parallel::DropoutStreams dropout_streams_;
  Transformer transformer_;
  Tensor lm_head_;  // (Vp / P, C), defined only when the head is not tied
  // The MoE blocks' gate results of the latest forward, whose load-balancing losses loss()
  // adds (Note [GPT-MoE] in moe_config.h), and the training passes' sums since
  // take_expert_load(). Mutable: a forward pass records them.
  mutable std::vector<moe::MoeOutput> moe_outputs_;
  mutable std::vector<parallel::ExpertLoad> expert_load_;
  mutable std::vector<Tensor> aux_sums_;  // per MoE block: expert_load_'s aux_loss, f64
  int64_t checkpoint_interval_ = 0;
  CheckpointPolicy checkpoint_policy_;
  int64_t batch_pieces_ = 1;  // set_batch_split()
  // Progressive layer drop (mutable: a training forward counts itself).
  mutable parallel::LayerDropper layer_drop_;
};

}  // namespace tessera
