#include "parallel/offload/swapped_optimizer_state.h"

#include <algorithm>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/grad_mode.h"

namespace tessera::parallel {

SwappedOptimizerState::SwappedOptimizerState(optim::Optimizer& optimizer,
                                             std::vector<SubGroup> sub_groups,
                                             TensorSwapper& swapper, SwapPipelining pipelining)
    : optimizer_(optimizer), swapper_(swapper), pipelining_(pipelining) {
  TS_CHECK(optimizer_.supports_parts(), "[offload] ", optimizer_.name(),
           " updates all its parameters together, so its state cannot be swapped a sub-group "
           "at a time; expected Adam, AdamW or SGD");
  std::set<std::string> all;
  for (const optim::ParamGroup& g : optimizer_.groups()) {
    for (const NamedParameter& p : g.params) all.insert(p.name);
  }
  for (SubGroup& s : sub_groups) {
    for (const std::string& name : s.params) {
      TS_CHECK(all.erase(name) == 1, "[offload] sub-group parameter \"", name,
               "\": expected a parameter of the optimizer in one sub-group only");
    }
    Group g;
    g.ids = std::move(s.storages);
    g.storage_ids = g.ids.size();
    g.gradients = std::move(s.gradients);
    g.params.insert(s.params.begin(), s.params.end());
    groups_.push_back(std::move(g));
  }
  TS_CHECK(all.empty(), "[offload] parameter \"", all.empty() ? "" : *all.begin(),
           "\" of the optimizer is in no sub-group; expected every parameter in one");
  swap_out_resident();
}

void SwappedOptimizerState::add_state(Group& g) {
  // Keys are "<kind>.<parameter name>" with kinds free of dots (optim::Optimizer).
  for (const auto& [key, t] : optimizer_.state_dict()) {
    const size_t dot = key.find('.');
    if (dot == std::string::npos || g.params.count(key.substr(dot + 1)) == 0) continue;
    g.ids.push_back(swapper_.add(t.storage()));
    state_ids_[key] = g.ids.back();
    g.state_known = true;  // none yet (before the first step; SGD without momentum): later
  }
}

std::vector<int64_t> SwappedOptimizerState::swapped_out(const std::vector<int64_t>& ids) const {
  std::vector<int64_t> out;
  for (const int64_t id : ids) {
    if (!swapper_.resident(id)) out.push_back(id);
  }
  return out;
}

void SwappedOptimizerState::step(const std::function<void(size_t)>& before,
                                 const std::function<void(size_t)>& after) {
  NoGradGuard no_grad;
  swapper_.wait();  // the gradients' writes from backward: their memory goes first
  // Group i's storages, state and gradients that are out of memory or on their way in.
  const auto incoming = [&](const Group& g) {
    std::vector<int64_t> in = swapped_out(g.ids);
    const std::vector<int64_t> gradients = swapped_out(g.gradients);
    in.insert(in.end(), gradients.begin(), gradients.end());
    return in;
  };
  for (size_t i = 0; i < groups_.size(); ++i) {
    Group& g = groups_[i];
    swapper_.swap_in(incoming(g));
    if (pipelining_.read_ahead && i + 1 < groups_.size()) {
      swapper_.prefetch(incoming(groups_[i + 1]));
    }
    if (before) before(i);
    optimizer_.update_part([&](const NamedParameter& p) { return g.params.count(p.name) > 0; });
    if (!g.state_known) add_state(g);
    if (after) after(i);
    if (pipelining_.write_behind && i > 0) {
      swapper_.wait_written(groups_[i - 1].ids);  // one sub-group leaving at a time
    }
    swapper_.swap_out(g.ids);
    swapper_.discard(g.gradients);
    if (!pipelining_.write_behind) swapper_.wait();
  }
  optimizer_.finish_step();
}

void SwappedOptimizerState::load(const StateDict& saved, const std::function<void(size_t)>& fill,
                                 const std::function<void(size_t)>& after) {
  NoGradGuard no_grad;
  swapper_.wait();
  optimizer_.begin_load(saved);  // checks all of it before anything changes
  for (Group& g : groups_) forget_state(g);
  for (size_t i = 0; i < groups_.size(); ++i) {
    Group& g = groups_[i];
    if (fill) {
      const std::vector<int64_t> storages = swapped_out(g.ids);  // only the given ones now
      swapper_.discard(storages);                                // zeros, with no read
      swapper_.swap_in(storages);
      fill(i);
    }
    optimizer_.load_part(saved,
                         [&](const NamedParameter& p) { return g.params.count(p.name) > 0; });
    add_state(g);
    if (fill && after) after(i);
    std::vector<int64_t> in_memory;  // the state, and given storages in memory
    for (const int64_t id : g.ids) {
      if (swapper_.resident(id)) in_memory.push_back(id);
    }
    swapper_.swap_out(in_memory);
  }
  swapper_.wait();
}

int64_t SwappedOptimizerState::state_id(const std::string& key) const {
  const auto it = state_ids_.find(key);
  return it == state_ids_.end() ? -1 : it->second;
}

void SwappedOptimizerState::forget_state(Group& g) {
  const auto state = g.ids.begin() + static_cast<ptrdiff_t>(g.storage_ids);
  for (auto it = state_ids_.begin(); it != state_ids_.end();) {
    it = std::find(state, g.ids.end(), it->second) != g.ids.end() ? state_ids_.erase(it)
                                                                  : std::next(it);
  }
  // Its memory goes, its regions stay unused in the file.
  swapper_.drop(std::vector<int64_t>(state, g.ids.end()));
  g.ids.resize(g.storage_ids);
  g.state_known = false;
}

void SwappedOptimizerState::make_storages_resident() {
  for (const Group& g : groups_) {
    swapper_.swap_in(swapped_out(std::vector<int64_t>(
        g.ids.begin(), g.ids.begin() + static_cast<ptrdiff_t>(g.storage_ids))));
  }
}

void SwappedOptimizerState::swap_out_resident() {
  for (Group& g : groups_) {
    if (!g.state_known) add_state(g);  // a loaded state, in memory since
    std::vector<int64_t> in_memory;
    for (const int64_t id : g.ids) {
      if (swapper_.resident(id)) in_memory.push_back(id);
    }
    swapper_.swap_out(in_memory);
  }
}

int64_t SwappedOptimizerState::resident_bytes() const {
  int64_t bytes = 0;
  for (const Group& g : groups_) {
    for (size_t i = 0; i < g.storage_ids; ++i) {
      if (swapper_.resident(g.ids[i])) bytes += swapper_.bytes(g.ids[i]);
    }
  }
  for (const auto& [key, t] : optimizer_.state_dict()) {
    if (key != "step") bytes += static_cast<int64_t>(t.storage().nbytes());
  }
  return bytes;
}

}  // namespace tessera::parallel
