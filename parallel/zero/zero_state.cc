#include "parallel/zero/zero_state.h"

#include <map>
#include <set>

#include "core/error.h"
#include "core/factories.h"
#include "core/grad_mode.h"

namespace tessera::parallel {
std::string chunk_name(int64_t block) { return "zero_block_" + std::to_string(block); }

StateDict whole_to_chunks(const StateDict& whole, const FlatLayout& layout, int rank) {
  NoGradGuard no_grad;
  // Group "<kind>.<parameter>" by kind, then shard each kind for this rank.
  std::map<std::string, std::vector<std::pair<std::string, Tensor>>> by_kind;
  StateDict chunks;
  for (const auto& [key, t] : whole) {
    if (key == "step") {
      chunks.emplace_back(key, t);
      continue;
    }
    const size_t dot = key.find('.');
    TS_CHECK(dot != std::string::npos, "[zero] optimizer state \"", key,
             "\": expected <kind>.<parameter name>");
    by_kind[key.substr(0, dot)].emplace_back(key.substr(dot + 1), t);
  }
  for (const auto& [kind, tensors] : by_kind) {
    TS_CHECK(tensors.size() == layout.params.size(), "[zero] optimizer state \"", kind,
             "\": expected one tensor per parameter (", layout.params.size(), "), found ",
             tensors.size());
    const Tensor s = shard(layout, rank, tensors);
    for (size_t b = 0; b < layout.blocks.size(); ++b) {
      const FlatLayout::Block& blk = layout.blocks[b];
      chunks.emplace_back(kind + "." + chunk_name(static_cast<int64_t>(b)),
                          s.narrow(0, blk.shard_offset, blk.chunk));
    }
  }
  return chunks;
}

StateDict whole_state(const FlatLayout& layout, const std::vector<StateDict>& shards) {
  TS_CHECK(static_cast<int>(shards.size()) == layout.world, "[zero] expected ", layout.world,
           " optimizer shards, found ", shards.size());
  StateDict out;
  std::map<std::string, std::vector<Tensor>> kinds;
  std::set<std::string> first_keys;
  for (size_t r = 0; r < shards.size(); ++r) {
    std::set<std::string> keys;
    for (const auto& [key, t] : shards[r]) {
      keys.insert(key);
      if (key == "step") {
        if (r == 0) out.emplace_back(key, t);
        TS_CHECK(t.numel() == 1 && t.item<int64_t>() == out.front().second.item<int64_t>(),
                 "[zero] optimizer shard ", r, " is at step ", t.item<int64_t>(),
                 "; expected step ", out.front().second.item<int64_t>(), " like shard 0");
      } else {
        kinds[key].push_back(t);
      }
    }
    if (r == 0) first_keys = keys;
    TS_CHECK(keys == first_keys && keys.count("step") == 1, "[zero] optimizer shard ", r,
             " holds different state kinds than shard 0; expected the same kinds and a step");
  }
  for (const auto& [kind, ts] : kinds) {
    for (auto& [name, t] : unshard(layout, ts)) out.emplace_back(kind + "." + name, t);
  }
  return out;
}

}  // namespace tessera::parallel
