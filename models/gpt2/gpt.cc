#include "models/gpt2/gpt.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "autograd/checkpoint.h"
#include "autograd/ops.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "models/gpt2/batch_split.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/layer_drop.h"
#include "parallel/tensor/cross_entropy.h"
#include "parallel/tensor/mappings.h"

namespace tessera {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Gpt::Transformer::Transformer(const GptConfig& cfg, const GptPart& part,
                              parallel::DropoutStreams& streams,
                              parallel::Communicator& model_group,
                              parallel::AsyncCollectives* async,
                              parallel::Communicator* expert_group)
    : h(part.first_block) {
  if (part.embedding || (part.head && cfg.tie_word_embeddings)) {
    wte = std::make_unique<parallel::VocabParallelEmbedding>(cfg.padded_vocab_size(), cfg.n_embd,
                                                             model_group);
    register_module("wte", *wte);
  }
  if (part.embedding) {
    wpe = std::make_unique<Embedding>(cfg.block_size, cfg.n_embd);
    drop = std::make_unique<Dropout>(cfg.dropout, streams.replicated());
    register_module("wpe", *wpe);
    register_module("drop", *drop);
  }
  const int64_t end = part.end_block < 0 ? cfg.n_layer : part.end_block;
  for (int64_t i = part.first_block; i < end; ++i) {
    h.push_back(std::make_unique<Block>(cfg, i, streams, model_group, async, expert_group));
  }
  register_module("h", h);
  if (part.final_norm) {
    ln_f = std::make_unique<LayerNorm>(cfg.n_embd, cfg.layer_norm_eps, cfg.bias);
    register_module("ln_f", *ln_f);
  }
}

namespace {

// The dropout streams' name: a pipeline stage that starts past block 0 draws its own
// masks, not the first stage's again (Megatron-LM likewise adds 100 x the pipeline rank to
// the seed: _set_random_seed in megatron/training/initialize.py).
std::string dropout_stream_name(const GptPart& part) {
  return part.first_block == 0 ? "dropout"
                               : "dropout from block " + std::to_string(part.first_block);
}

// The group the model splits over: the given one, or a group of one it owns.
std::unique_ptr<parallel::Communicator> own_group(const GptConfig& cfg,
                                                  parallel::Communicator* given) {
  cfg.validate();
  if (given != nullptr) {
    TS_CHECK(cfg.n_head % given->size() == 0, "[gpt2] n_head ", cfg.n_head,
             " does not split over a tensor-parallel group of ", given->size(),
             "; expected a multiple of ", given->size());
    return nullptr;
  }
  return std::move(parallel::make_thread_group(1)[0]);
}

}  // namespace

Gpt::Gpt(const GptConfig& cfg, uint64_t seed, parallel::Communicator* model_group,
         const GptPart& part, bool overlap_comm, parallel::Communicator* expert_group)
    : cfg_(cfg),
      seed_(seed),
      part_(part),
      own_group_(own_group(cfg, model_group)),
      model_group_(model_group ? *model_group : *own_group_),
      model_async_(overlap_comm && model_group_.size() > 1
                       ? std::make_unique<parallel::AsyncCollectives>(model_group_)
                       : nullptr),
      dropout_streams_(seed, dropout_stream_name(part), model_group_.rank()),
      transformer_(cfg, part, dropout_streams_, model_group_, model_async_.get(), expert_group),
      layer_drop_(seed) {
  TS_CHECK(part.first_block >= 0 && part.first_block <= cfg.n_layer &&
               (part.end_block < 0 ||
                (part.end_block >= part.first_block && part.end_block <= cfg.n_layer)),
           "[gpt2] blocks [", part.first_block, ", ", part.end_block, ") are not blocks of a ",
           cfg.n_layer, "-layer model");
  register_module("transformer", transformer_);
  if (part.head && !cfg.tie_word_embeddings) {
    const int64_t rows = cfg.padded_vocab_size() / model_group_.size();  // Vp / P, split like wte
    lm_head_ = zeros({rows, cfg.n_embd});
    register_parameter("lm_head.weight", lm_head_, {Placement::Kind::sharded, 0, 1});
  }
  for (const NamedParameter& p : named_parameters()) {
    if (p.tensor.materialized()) init_value(p.name, p.placement, p.tensor);
  }
}

void Gpt::init_parameter(const std::string& name, const Tensor& out) const {
  for (const NamedParameter& p : named_parameters()) {
    if (p.name == name) return init_value(name, p.placement, out);
  }
  TS_FAIL("[gpt2] init_parameter: expected a parameter of this model, found \"", name, "\"");
}

void Gpt::init_value(const std::string& name, const Placement& placement, const Tensor& out) const {
  NoGradGuard no_grad;
  if (ends_with(name, ".bias")) {
    out.fill_(0.0);
    return;
  }
  if (name.find(".ln_") != std::string::npos) {
    out.fill_(1.0);  // LayerNorm weights: ln_1, ln_2, ln_f
    return;
  }
  const double std = 0.02;
  const double residual_std = std / std::sqrt(2.0 * static_cast<double>(cfg_.n_layer));
  const int size = model_group_.size(), rank = model_group_.rank();
  const int64_t pad = cfg_.padded_vocab_size() - cfg_.vocab_size;
  // Drawn on the full logical shape; a tensor-parallel rank keeps its slice.
  const bool sharded = placement.kind == Placement::Kind::sharded;
  Shape full_shape = out.shape();
  if (sharded) full_shape[placement.dim] *= size;
  const bool residual = ends_with(name, "c_proj.weight");
  Generator gen = Generator::for_name(seed_, name);
  const Tensor full = randn(full_shape, gen, {out.dtype()}, 0.0, residual ? residual_std : std);
  const bool vocab_rows = name == "transformer.wte.weight" || name == "lm_head.weight";
  if (vocab_rows && pad > 0) full.narrow(0, cfg_.vocab_size, pad).fill_(0.0);
  out.copy_(sharded
                ? parallel::model_parallel_slice(full, placement.dim, placement.parts, rank, size)
                : full);
}

void Gpt::require(bool has, const char* what) const {
  TS_CHECK(has, "[gpt2] ", what, "; this pipeline stage holds ", part_.describe(cfg_));
}

Tensor Gpt::embed(const Tensor& idx, int64_t start) const {
  TS_CHECK(idx.dim() == 2, "[gpt2] expected token ids of shape (B, T), found ",
           shape_str(idx.shape()));
  const int64_t t = idx.size(1);
  TS_CHECK(start + t <= cfg_.block_size, "[gpt2] sequence of ", start + t,
           " positions exceeds block_size ", cfg_.block_size);
  const Tensor pos = arange(static_cast<double>(start), static_cast<double>(start + t), 1.0,
                            {DType::i64, idx.device()});
  const Tensor x = (*transformer_.wte)(idx) + (*transformer_.wpe)(pos);  // (B, T, C)
  return transformer_.drop->forward(x);
}

Tensor Gpt::head(const Tensor& x) const {
  // Replicated activations meet the vocabulary-split weight: a column-parallel product.
  // The head's weight is wte's (tied) or this module's own lm_head.
  const bool tied = cfg_.tie_word_embeddings;
  const ModuleCall call(tied ? static_cast<const Module&>(*transformer_.wte) : *this);
  const Tensor& weight = tied ? transformer_.wte->weight() : lm_head_;
  return call.output(parallel::column_parallel_linear(x, weight, Tensor(), model_group_,
                                                      model_async_.get()));  // -> (B, T, Vp / P)
}

void Gpt::set_layer_drop(double theta, int64_t step) {
  TS_CHECK(checkpoint_interval_ == 0 && !cfg_.moe,
           "[gpt2] progressive_layer_drop: expected a model without activation checkpointing "
           "and without MoE blocks (a recomputation would draw again; a skipped MoE block "
           "would leave its gate out)");
  layer_drop_.set(theta, step);
}

void Gpt::set_batch_split(int64_t pieces) {
  TS_CHECK(pieces >= 1, "[gpt2] batch split: expected at least 1 piece, found ", pieces);
  TS_CHECK(pieces == 1 || (model_async_ && !cfg_.moe), "[gpt2] batch split into ", pieces,
           " pieces overlaps tensor-parallel sums; expected a model group of several ranks with "
           "overlap_comm and no MoE blocks, found a group of ",
           model_group_.size(), model_async_ ? "" : " without overlap_comm",
           cfg_.moe ? " and MoE blocks" : "");
  batch_pieces_ = pieces;
}

std::vector<BlockCall> Gpt::kept_blocks() const {
  // Note [Progressive layer drop]: layers are numbered over the whole model.
  const int64_t forward = layer_drop_.next_forward();
  std::vector<BlockCall> calls;
  for (size_t i = 0; i < transformer_.h.size(); ++i) {
    const int64_t layer = part_.first_block + static_cast<int64_t>(i);
    if (const std::optional<double> divisor = layer_drop_.keep(forward, layer, cfg_.n_layer)) {
      calls.push_back({&block(i), *divisor});
    }
  }
  return calls;
}

Tensor Gpt::batch_split_blocks(Tensor x) const {
  if (layer_drop_.active() && is_training())
    return run_batch_split(kept_blocks(), x, batch_pieces_);
  std::vector<BlockCall> calls;
  for (size_t i = 0; i < transformer_.h.size(); ++i) calls.push_back({&block(i), 1.0});
  // Each checkpoint segment (all blocks without checkpointing) runs split on its own.
  const size_t per_segment =
      checkpoint_interval_ > 0 ? static_cast<size_t>(checkpoint_interval_) : calls.size();
  const size_t segments = calls.empty() ? 0 : (calls.size() + per_segment - 1) / per_segment;
  return checkpoint_sequential(
      std::move(x), segments, checkpoint_interval_ > 0 ? 1 : 0,
      [this, calls, per_segment](size_t s, const Tensor& y) {
        const size_t first = s * per_segment, end = std::min(calls.size(), first + per_segment);
        return run_batch_split({calls.begin() + first, calls.begin() + end}, y, batch_pieces_);
      },
      dropout_streams_.generators(), checkpoint_policy_);
}

Tensor Gpt::blocks(Tensor x) const {
  if (batch_pieces_ > 1) return batch_split_blocks(std::move(x));
  if (layer_drop_.active() && is_training()) {
    for (const BlockCall& call : kept_blocks())
      x = call.block->forward(x, &moe_outputs_, call.divisor);
    return x;
  }
  if (cfg_.moe && checkpoint_interval_ > 0 && GradMode::is_enabled()) {
    return checkpointed_moe_blocks(std::move(x));
  }
  return checkpoint_sequential(
      std::move(x), transformer_.h.size(), checkpoint_interval_,
      [this](size_t i, const Tensor& y) { return block(i).forward(y, &moe_outputs_); },
      dropout_streams_.generators(), checkpoint_policy_);
}

Tensor Gpt::checkpointed_moe_blocks(Tensor x) const {
  const size_t n = transformer_.h.size(), k = static_cast<size_t>(checkpoint_interval_);
  for (size_t first = 0; first < n; first += k) {
    const size_t end = std::min(n, first + k);
    // The first run's gate results (routing, for the counts); the recomputation's are the same.
    auto first_run = std::make_shared<std::vector<moe::MoeOutput>>();
    const TensorList out = checkpoint(
        // By value: backward recomputes the segment after this function has returned.
        [this, first, end, first_run](const TensorList& in) {
          std::vector<moe::MoeOutput> segment;
          Tensor y = in[0];
          for (size_t i = first; i < end; ++i) y = block(i).forward(y, &segment);
          TensorList outputs{y};
          for (const moe::MoeOutput& m : segment) outputs.push_back(m.l_aux);
          if (first_run->empty()) *first_run = std::move(segment);
          return outputs;
        },
        {x}, dropout_streams_.generators(), checkpoint_policy_);
    x = out[0];
    for (size_t j = 0; j < first_run->size(); ++j) {
      moe::MoeOutput m = std::move((*first_run)[j]);
      m.l_aux = out[1 + j];  // the segment's output: loss() reaches the gate through it
      moe_outputs_.push_back(std::move(m));
    }
  }
  return x;
}

Tensor Gpt::forward(const Tensor& idx) const {
  require(part_.whole(cfg_), "forward needs the whole model (use forward_stage)");
  return forward_stage(idx);
}

void Gpt::count_expert_load() const {
  if (expert_load_.empty()) {
    const int64_t end = part_.end_block < 0 ? cfg_.n_layer : part_.end_block;
    for (int64_t layer = part_.first_block; cfg_.moe && layer < end; ++layer) {
      if (cfg_.moe->is_moe_block(layer)) {
        parallel::ExpertLoad load;
        load.block = layer;
        load.tokens.assign(static_cast<size_t>(cfg_.moe->experts_at(layer)), 0);
        expert_load_.push_back(std::move(load));
      }
    }
    aux_sums_.resize(expert_load_.size());
  }
  TS_INTERNAL_ASSERT(moe_outputs_.size() == expert_load_.size(), "one gate result per MoE block");
  for (size_t i = 0; i < moe_outputs_.size(); ++i) {
    const moe::Routing& r = moe_outputs_[i].routing;
    parallel::ExpertLoad& load = expert_load_[i];
    for (size_t e = 0; e < load.tokens.size(); ++e) load.tokens[e] += r.counts[e];
    load.dropped += r.dropped;
    load.capacity = r.capacity;
    ++load.passes;
    // Summed on the loss's device, read when taken (reading each would wait for it).
    NoGradGuard no_grad;
    const Tensor aux = moe_outputs_[i].l_aux.detach().to(DType::f64);
    aux_sums_[i] = aux_sums_[i].defined() ? add(aux_sums_[i], aux) : aux;
  }
}

std::vector<parallel::ExpertLoad> Gpt::take_expert_load() {
  std::vector<parallel::ExpertLoad> taken = std::move(expert_load_);
  for (size_t i = 0; i < taken.size(); ++i) {
    taken[i].aux_loss = aux_sums_[i].to(Device::cpu()).item<double>();
  }
  expert_load_.clear();
  aux_sums_.clear();
  return taken;
}

bool Gpt::is_expert_parameter(const std::string& name) const {
  return name.rfind("transformer.h.", 0) == 0 && name.find(".mlp.experts.") != std::string::npos;
}

std::vector<Module*> Gpt::expert_modules() {
  std::vector<Module*> out;
  for (size_t i = 0; i < transformer_.h.size(); ++i) {
    if (moe::MoeLayer* layer = block(i).moe()) out.push_back(&layer->experts());
  }
  return out;
}

std::vector<std::string> Gpt::tied_parameter_names() const {
  const bool split = !(part_.embedding && part_.head);
  if (cfg_.tie_word_embeddings && split && (part_.embedding || part_.head)) {
    return {"transformer.wte.weight"};
  }
  return {};
}

Tensor Gpt::forward_stage(const Tensor& input) const {
  const ModuleScope scope(*this);  // Note [Forward observers]
  moe_outputs_.clear();
  Tensor x = part_.embedding ? embed(input, 0) : input;
  x = blocks(x);
  if (is_training()) count_expert_load();
  if (part_.final_norm) x = (*transformer_.ln_f)(x);
  return part_.head ? head(x) : x;
}

Tensor Gpt::loss(const Tensor& logits, const Tensor& targets) const {
  require(part_.head, "the loss needs the LM head");
  TS_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
               logits.size(1) == targets.size(1),
           "[gpt2] loss expects logits (B, T, Vp) and targets (B, T), found ",
           shape_str(logits.shape()), " and ", shape_str(targets.shape()));
  const int64_t rows = logits.size(0) * logits.size(1);
  if (model_group_.size() > 1) {
    return parallel::vocab_parallel_cross_entropy(reshape(logits, {rows, logits.size(2)}),
                                                  reshape(targets, {rows}), cfg_.vocab_size,
                                                  model_group_);
  }
  // The padding columns are not classes (cross_entropy's `classes`).
  const Tensor loss = cross_entropy(reshape(logits, {rows, logits.size(2)}),
                                    reshape(targets, {rows}), -100, cfg_.vocab_size);
  const Tensor aux = aux_term(loss.dtype());  // Note [GPT-MoE] in moe_config.h
  return aux.defined() ? add(loss, aux) : loss;
}

Tensor Gpt::aux_term(DType dtype) const {
  if (!cfg_.moe || !is_training() || moe_outputs_.empty()) return Tensor();
  Tensor aux = moe_outputs_.front().l_aux;
  for (size_t i = 1; i < moe_outputs_.size(); ++i) aux = add(aux, moe_outputs_[i].l_aux);
  const Tensor sum = cast(aux, dtype);
  return mul(sum, scalar_like(sum, cfg_.moe->aux_loss_coef));
}

Tensor Gpt::stage_extra_loss() const { return part_.head ? Tensor() : aux_term(DType::f32); }

Tensor Gpt::forward_cached(const Tensor& idx, KvCache& cache) const {
  TS_CHECK(model_group_.size() == 1,
           "[gpt2] KV-cached inference runs on one rank; found a "
           "tensor-parallel group of ",
           model_group_.size());
  require(part_.whole(cfg_), "KV-cached inference needs the whole model");
  NoGradGuard no_grad;
  Tensor x = embed(idx, cache.length);
  for (size_t i = 0; i < transformer_.h.size(); ++i) {
    x = block(i).forward_cached(x, cache.keys[i], cache.values[i], cache.length);
  }
  cache.length += idx.size(1);
  return head((*transformer_.ln_f)(x));
}

}  // namespace tessera
