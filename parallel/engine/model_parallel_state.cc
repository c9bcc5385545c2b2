#include "parallel/engine/model_parallel_state.h"

#include <map>
#include <set>
#include <string>

#include "core/error.h"
#include "parallel/tensor/mappings.h"

namespace tessera::parallel {
namespace {

// The parameter a state key belongs to ("<name>" or "<kind>.<name>"), or null.
const NamedParameter* owner(const std::string& key,
                            const std::map<std::string, const NamedParameter*>& by_name) {
  if (auto it = by_name.find(key); it != by_name.end()) return it->second;
  const size_t dot = key.find('.');
  if (dot == std::string::npos) return nullptr;
  auto it = by_name.find(key.substr(dot + 1));
  return it == by_name.end() ? nullptr : it->second;
}

std::map<std::string, const NamedParameter*> index(const std::vector<NamedParameter>& params) {
  std::map<std::string, const NamedParameter*> by_name;
  for (const NamedParameter& p : params) by_name[p.name] = &p;
  return by_name;
}

Tensor slice_of(const Tensor& full, const Placement& placement, int rank, int size) {
  if (placement.kind == Placement::Kind::replicated || size == 1) return full;
  return parallel::model_parallel_slice(full, placement.dim, placement.parts, rank, size);
}

}  // namespace

StateDict gather_full(const StateDict& local, const std::vector<NamedParameter>& params,
                      Communicator& model) {
  const auto by_name = index(params);
  StateDict out;
  for (const auto& [key, t] : local) {
    const NamedParameter* p = owner(key, by_name);
    out.emplace_back(key, p ? parallel::gather_model_parallel_slices(t, p->placement, model) : t);
  }
  return out;
}

StateDict take_local(const StateDict& full, const std::vector<NamedParameter>& params, int rank,
                     int size, bool optimizer) {
  const std::map<std::string, Tensor> by_key(full.begin(), full.end());
  StateDict out;
  if (!optimizer) {
    for (const NamedParameter& p : params) {
      auto it = by_key.find(p.name);
      TS_CHECK(it != by_key.end(), "[checkpoint] expected weights for ", p.name,
               ", found none in the checkpoint");
      out.emplace_back(p.name, slice_of(it->second, p.placement, rank, size));
    }
    return out;
  }
  std::set<std::string> kinds;
  for (const auto& [key, t] : full) {
    if (key == "step") {
      out.emplace_back(key, t);
    } else if (const size_t dot = key.find('.'); dot != std::string::npos) {
      kinds.insert(key.substr(0, dot));
    }
  }
  for (const std::string& kind : kinds) {
    for (const NamedParameter& p : params) {
      auto it = by_key.find(kind + "." + p.name);
      TS_CHECK(it != by_key.end(), "[checkpoint] expected optimizer state ", kind, ".", p.name,
               ", found none in the checkpoint");
      out.emplace_back(it->first, slice_of(it->second, p.placement, rank, size));
    }
  }
  return out;
}

StateDict take_entries(StateDict& state, const std::function<bool(const std::string&)>& is_param,
                       bool optimizer) {
  StateDict taken, kept;
  for (auto& entry : state) {
    const std::string& key = entry.first;
    const size_t dot = key.find('.');
    const bool match =
        optimizer ? key != "step" && dot != std::string::npos && is_param(key.substr(dot + 1))
                  : is_param(key);
    (match ? taken : kept).push_back(std::move(entry));
  }
  state = std::move(kept);
  return taken;
}

void check_only_parameters(const StateDict& state, const std::vector<NamedParameter>& params,
                           bool optimizer) {
  const auto by_name = index(params);
  for (const auto& [key, t] : state) {
    const bool ok = optimizer ? key == "step" || (key.find('.') != std::string::npos &&
                                                  by_name.count(key.substr(key.find('.') + 1)))
                              : by_name.count(key) > 0;
    TS_CHECK(ok, "[checkpoint] unexpected ", optimizer ? "optimizer state " : "weights ", "\"", key,
             "\"; expected only ",
             optimizer ? "\"step\" and <kind>.<parameter name>" : "the model's parameters");
  }
}

}  // namespace tessera::parallel
