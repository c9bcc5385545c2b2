// A model kind as a type (Note [Model kinds]): what the trainer needs to build, describe,
// checkpoint and feed a model, whatever its kind.
//
// Note [Model kinds]
// The run config's model.type names a kind; models/model_kinds.cc lists the kinds with the
// parser of each one's model section, which returns its ModelSpec. A spec knows its
// hyperparameters and builds the model (a LanguageModel: parallel::TrainableModel on token
// ids) for one rank's place in the grid; the model declares the parallel modes it supports
// (TrainableModel::capabilities()), and the spec what else its kind can do (pretrained
// weights, generation). Adding a kind is a folder under models/ with its model and spec
// (models/gpt2/spec.h, models/bert/spec.h), and one line in model_kinds.cc with its
// library in models/BUILD: nothing in tools/ or parallel/ changes.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/json.h"
#include "models/language_model.h"
#include "models/sampling_options.h"
#include "models/sparse/sparsity_config.h"
#include "parallel/comm/communicator.h"
#include "parallel/pipeline/executor.h"

namespace tessera {

// One rank's place for its model: the pipeline stage it holds and its tensor-slicing
// group.
struct ModelPlacement {
  int64_t stages = 1;                             // pipeline stages
  int64_t stage = 0;                              // this rank's
  std::string partition_method = "parameters";    // DeepSpeed's PipelineModule partition_method
  parallel::Communicator* model_group = nullptr;  // tensor slicing; null: none
  // Tensor slicing's input-gradient sums overlapped with the weight gradients' products
  // (Note [Overlapped input gradients] in parallel/tensor/layers.h).
  bool overlap_model_comm = true;
  // Pieces of a micro-batch whose tensor-parallel sums overlap each other's computation
  // (tensor_parallel.batch_split; Note [Batch-split overlap] in models/gpt2/batch_split.h).
  int64_t model_batch_split = 1;
  // Expert parallelism: the expert-parallel group that MoE layers split their experts over
  // (parallel/expert/expert_groups.h); null: every rank holds all experts.
  parallel::Communicator* expert_group = nullptr;
};

// What a kind supports beyond training.
struct ModelFeatures {
  parallel::ModelCapabilities modes;  // its models' capabilities(): pipeline, slicing
  bool pretrained_weights = false;    // load_pretrained() (model.init_from)
  bool generation = false;            // generate() (trainer.sample)
  // set_layer_drop() (progressive_layer_drop; Note [Progressive layer drop] in
  // parallel/layer_drop.h), without activation checkpointing
  bool layer_drop = false;
};

class ModelSpec {
 public:
  virtual ~ModelSpec() = default;
  // model.type: "gpt2", "bert".
  virtual std::string type() const = 0;
  // The model section as checkpoints record it; a run resumes only from one that is equal
  // once without_placement() has dropped what only places it on ranks.
  virtual nlohmann::json to_json() const = 0;
  // `model` (a to_json() of this kind) without its keys that place the model on ranks
  // rather than define it (GPT-MoE's ep_size), so that a checkpoint resumes under another.
  virtual nlohmann::json without_placement(nlohmann::json model) const { return model; }
  // The expert-parallel group size its mixture-of-experts layers ask for (1: none).
  virtual int64_t expert_parallel_size() const { return 1; }
  // Of num_parameters(), the experts' (0 without a mixture of experts).
  virtual int64_t expert_parameters() const { return 0; }
  // "GPT-2 4 layers, 4 heads, width 128, 818944 parameters, dense attention".
  virtual std::string describe() const = 0;
  // Parameters of the whole model (padded vocabulary included).
  virtual int64_t num_parameters() const = 0;
  // Training FLOPs per token at `seq_len` positions, PaLM appendix B: 6N + 12 L H Q T.
  virtual double flops_per_token(int64_t seq_len) const = 0;
  virtual int64_t vocab_size() const = 0;  // token ids are in [0, vocab_size)
  virtual int64_t block_size() const = 0;  // the longest sequence
  // The width of the residual stream (Hugging Face's config.hidden_size).
  virtual int64_t hidden_size() const = 0;
  // What this kind supports beyond data-parallel training.
  virtual ModelFeatures features() const = 0;
  // Throws, naming the config key, when `stages` pipeline stages or `tp` tensor-parallel
  // ranks do not fit this model (heads or vocabulary that do not split, too few layers).
  // Called only for modes features() has.
  virtual void check_layout(int64_t stages, int64_t tp) const = 0;
  // This rank's model: its stage's layers, sliced over placement.model_group, initialized
  // from `seed` (the same weights on every rank).
  virtual std::unique_ptr<LanguageModel> build(uint64_t seed,
                                               const ModelPlacement& placement) const = 0;
  // The model's inputs and targets from a window of tokens (B, T) and the tokens that
  // follow each (B, T): the pair itself for a next-token model; a masked-LM corrupts the
  // window with draws keyed by (`seed`, `counter`).
  virtual parallel::pipeline::MicroBatch example(const Tensor& window, const Tensor& next,
                                                 uint64_t seed, uint64_t counter) const;
  // Loads pretrained weights (features().pretrained_weights) into `model`, which build()
  // made. Throws naming the file when they do not fit.
  virtual void load_pretrained(LanguageModel& model, const std::string& path) const;
  // `tokens` new token ids after `prompt` (features().generation), from a whole model.
  virtual std::vector<int32_t> generate(const LanguageModel& model,
                                        const std::vector<int32_t>& prompt, int64_t tokens,
                                        const SamplingOptions& options) const;
};

// A transformer's training FLOPs per token, PaLM appendix B: 6 N + 12 L C T, N its
// parameters, L layers of width C, T = `seq_len`; a `sparse` layout scales the attention
// term by the fraction of (query, key) blocks it computes over `heads` heads.
double transformer_flops_per_token(int64_t params, int64_t layers, int64_t width, int64_t heads,
                                   int64_t seq_len, const std::optional<SparsityConfig>& sparse);
// The attention for a description: "dense", or "block-sparse (fixed, block 16)".
std::string attention_description(const std::optional<SparsityConfig>& sparse);

}  // namespace tessera
