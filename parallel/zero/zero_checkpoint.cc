// ZeroOptimizer's state for checkpoints: the shard a rank saves and loads (Note [Streamed
// checkpoints] in zero_optimizer.h), the whole state and parameters that other layouts
// load through, and the 1-bit optimizers' per-rank state.
#include <algorithm>
#include <functional>
#include <map>

#include "core/error.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "parallel/zero/zero_optimizer.h"
#include "parallel/zero/zero_state.h"

namespace tessera::parallel {

StateDict ZeroOptimizer::rank_state() const {
  return onebit_ != nullptr ? onebit_->rank_state() : StateDict{};
}

void ZeroOptimizer::load_rank_state(const StateDict& saved) {
  settle_communication();
  TS_CHECK(onebit_ != nullptr || saved.empty(), "[zero] ", inner_->name(),
           " keeps no per-rank state; expected none, found \"", saved.front().first, "\"");
  if (onebit_ == nullptr) return;
  NoGradGuard no_grad;
  onebit_->load_rank_state(saved);
  master_->round_into_model();  // 0/1 Adam's local parameters (1-bit runs are stage 0)
}

void ZeroOptimizer::reset_rank_state() {
  if (onebit_ == nullptr) return;
  NoGradGuard no_grad;
  onebit_->reset_rank_state();
}

StateDict ZeroOptimizer::state_dict() const {
  return sharded() ? materialize(shard_pieces(false)) : inner_->state_dict();
}

StreamedTensor ZeroOptimizer::chunked_shard(std::string name, std::vector<Tensor> chunks,
                                            std::vector<int64_t> ids) const {
  StreamedTensor s;
  s.name = std::move(name);
  s.shape = {layout_.shard_numel()};
  s.produce = [this, chunks = std::move(chunks),
               ids = std::move(ids)](const StreamedTensor::Take& take) {
    NoGradGuard no_grad;
    const auto use = [&](size_t b) { take(chunks[b].to(Device::cpu()).contiguous()); };
    if (offload_ == nullptr) {
      for (size_t b = 0; b < chunks.size(); ++b) use(b);
    } else {
      offload_->swapper().read_each(ids, use);
    }
  };
  return s;
}

StreamedStateDict ZeroOptimizer::shard_pieces(bool with_parameters) const {
  TS_INTERNAL_ASSERT(sharded(), "shard_pieces() is for stages 1-3");
  settle_communication();
  const int64_t blocks = static_cast<int64_t>(layout_.blocks.size());
  // Chunk b's state of each kind is "<kind>.zero_block_<b>" (zero_state.h); the chunks
  // tile the shard in block order (FlatLayout::Block::shard_offset).
  StreamedStateDict out;
  std::vector<std::string> kinds;
  std::map<std::string, Tensor> by_key;
  for (const auto& [key, t] : inner_->state_dict()) {
    if (key == "step") {
      out.push_back(streamed(key, t.clone()));
      continue;
    }
    by_key.emplace(key, t);
    const std::string kind = key.substr(0, key.find('.'));
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) kinds.push_back(kind);
  }
  for (const std::string& kind : kinds) {
    std::vector<Tensor> chunks;
    std::vector<int64_t> ids;
    for (int64_t b = 0; b < blocks; ++b) {
      const std::string key = kind + "." + chunk_name(b);
      chunks.push_back(by_key.at(key));
      ids.push_back(offload_ ? offload_->state_id(key) : -1);
    }
    out.push_back(chunked_shard(kind, std::move(chunks), std::move(ids)));
  }
  if (with_parameters && shards_parameters()) {
    std::vector<Tensor> chunks;
    std::vector<int64_t> ids;
    for (int64_t b = 0; b < blocks; ++b) {
      chunks.push_back(weights_->own_chunk(b));
      ids.push_back(offload_ ? offload_->master_id(b) : -1);
    }
    out.push_back(chunked_shard(kParameterShard, std::move(chunks), std::move(ids)));
  }
  return out;
}

ZeroOptimizer::ShardParts ZeroOptimizer::shard_parts(const StateDict& shard) const {
  TS_CHECK(sharded(), "[zero] a shard is for stages 1-3; this is stage ", config_.stage);
  ShardParts parts;
  for (const auto& [key, t] : shard) {
    if (key == "step") {
      parts.chunks.emplace_back(key, t);
      continue;
    }
    TS_CHECK(t.dtype() == DType::f32 && t.dim() == 1 && t.numel() == layout_.shard_numel(),
             "[zero] optimizer shard \"", key, "\": expected f32 (", layout_.shard_numel(),
             ") for this layout, found ", t.str());
    if (key == kParameterShard) {
      parts.params = t;
      continue;
    }
    for (size_t b = 0; b < layout_.blocks.size(); ++b) {
      const FlatLayout::Block& blk = layout_.blocks[b];
      parts.chunks.emplace_back(key + "." + chunk_name(static_cast<int64_t>(b)),
                                t.narrow(0, blk.shard_offset, blk.chunk));
    }
  }
  TS_CHECK(!parts.params.defined() || shards_parameters(),
           "[zero] optimizer shard: expected no parameter shard \"", kParameterShard,
           "\" at stage ", config_.stage, " with ", dtype_name(precision_.dtype),
           " parameters (load_parameters() loads them), found one");
  inner_->check_state_dict(parts.chunks);
  return parts;
}

void ZeroOptimizer::check_shard(const StateDict& shard) const { shard_parts(shard); }

void ZeroOptimizer::load_shard(const StateDict& shard) {
  settle_communication();
  NoGradGuard no_grad;
  const ShardParts parts = shard_parts(shard);  // everything checked first
  const Tensor& params = parts.params;
  // The step's order (Note [Streamed checkpoints]): masters, state, rounding.
  std::function<void(int64_t)> set_master;
  if (params.defined()) {
    set_master = [&](int64_t b) {
      const FlatLayout::Block& blk = layout_.blocks[static_cast<size_t>(b)];
      weights_->own_chunk(b).copy_(params.narrow(0, blk.shard_offset, blk.chunk));
    };
  }
  const bool round = weights_->rounds_in_step();
  if (offload_) {
    offload_->load(parts.chunks, set_master, [&](int64_t b) {
      if (round) weights_->round_chunk(b, Tensor());
    });
  } else {
    inner_->begin_load(parts.chunks);
    for (int64_t b = 0; b < static_cast<int64_t>(layout_.blocks.size()) && set_master; ++b) {
      set_master(b);
      if (round) weights_->round_chunk(b, Tensor());
    }
    inner_->load_part(parts.chunks, [](const NamedParameter&) { return true; });
  }
  if (params.defined()) weights_->after_step();  // every rank's parameters take the values
}

StateDict ZeroOptimizer::whole_state_dict() const {
  if (!sharded()) return state_dict();
  settle_communication();
  NoGradGuard no_grad;
  const StateDict mine = state_dict();
  std::vector<StateDict> shards(static_cast<size_t>(dp_.size()));
  for (const auto& [key, t] : mine) {
    if (key == "step") {
      for (StateDict& s : shards) s.emplace_back(key, t);
      continue;
    }
    const Tensor all = empty({t.numel() * dp_.size()}, {t.dtype(), device_});
    dp_.all_gather(t.to(device_).contiguous(), all);
    for (int r = 0; r < dp_.size(); ++r) {
      shards[r].emplace_back(key, all.narrow(0, r * t.numel(), t.numel()).to(Device::cpu()));
    }
  }
  return whole_state(layout_, shards);
}

void ZeroOptimizer::load_whole_state(const StateDict& whole) {
  settle_communication();
  const StateDict state = sharded() ? whole_to_chunks(whole, layout_, dp_.rank()) : whole;
  if (offload_) {
    offload_->load(state, {}, {});  // the masters as they are
  } else {
    inner_->load_state_dict(state);
  }
}

StateDict ZeroOptimizer::whole_parameters() {
  settle_communication();
  make_masters_resident();
  StateDict out;
  const std::vector<Tensor> values = weights_->whole();
  for (size_t i = 0; i < values.size(); ++i) out.emplace_back(layout_.params[i].name, values[i]);
  return out;
}

bool ZeroOptimizer::shards_parameters() const { return weights_->sharded_parameters(); }

void ZeroOptimizer::load_parameters(const StateDict& whole) {
  settle_communication();
  make_masters_resident();
  std::map<std::string, Tensor> given(whole.begin(), whole.end());
  std::vector<Tensor> ordered;
  for (const FlatLayout::Param& p : layout_.params) {
    const auto it = given.find(p.name);
    TS_CHECK(it != given.end(), "[zero] expected a value for parameter \"", p.name,
             "\", found none");
    TS_CHECK(it->second.shape() == p.shape && it->second.dtype() == DType::f32,
             "[zero] parameter \"", p.name, "\": expected f32 ", shape_str(p.shape), ", found ",
             it->second.str());
    ordered.push_back(it->second);
    given.erase(it);
  }
  TS_CHECK(given.empty(), "[zero] unexpected tensor \"", given.empty() ? "" : given.begin()->first,
           "\"; expected only the model's trainable parameters");
  weights_->load(ordered);
}

}  // namespace tessera::parallel
