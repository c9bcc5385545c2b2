#include "optim/optimizer.h"

#include <algorithm>
#include <map>
#include <optional>

#include "core/error.h"
#include "core/factories.h"

namespace tessera::optim {

std::vector<ParamGroup> decay_groups(const std::vector<NamedParameter>& params, double lr,
                                     double weight_decay, bool exclude_1d,
                                     const std::vector<std::string>& exclude_names) {
  ParamGroup decay{{}, lr, weight_decay};
  ParamGroup no_decay{{}, lr, 0.0};
  for (const NamedParameter& p : params) {
    bool excluded = exclude_1d && p.tensor.dim() < 2;
    for (const std::string& pattern : exclude_names) {
      excluded = excluded || p.name.find(pattern) != std::string::npos;
    }
    (excluded ? no_decay : decay).params.push_back(p);
  }
  std::vector<ParamGroup> groups;
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  return groups;
}

Optimizer::Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  for (const ParamGroup& g : groups_) {
    for (const NamedParameter& p : g.params) {
      TS_CHECK(p.tensor.defined(), "[optimizer] parameter \"", p.name, "\" is undefined");
      TS_CHECK(index_.emplace(p.name, index_.size()).second, "[optimizer] parameter \"", p.name,
               "\" appears in more than one place; expected each parameter once");
    }
  }
}

void Optimizer::update_part(const ParamSelection&) {
  TS_CHECK(false, "[optimizer] ", name(),
           " does not step in parts; expected an optimizer that does (Adam, AdamW, SGD)");
}

void Optimizer::scaled_update(const ScaledStep&) {
  TS_CHECK(false, "[optimizer] ", name(),
           " takes no scaled steps; expected an optimizer that does (Adam, AdamW)");
}

void Optimizer::zero_grad() {
  for (const ParamGroup& g : groups_) {
    for (const NamedParameter& p : g.params) p.tensor.set_grad(Tensor());
  }
}

void Optimizer::set_lr(double lr) {
  for (ParamGroup& g : groups_) g.lr = lr;
}

bool Optimizer::has_state(const std::string& kind, const NamedParameter& p) const {
  for (const auto& [k, tensors] : state_) {
    if (k == kind) return tensors[index_.at(p.name)].defined();
  }
  return false;
}

Tensor& Optimizer::state(const std::string& kind, const NamedParameter& p) {
  auto it =
      std::find_if(state_.begin(), state_.end(), [&](const auto& e) { return e.first == kind; });
  if (it == state_.end()) {
    state_.emplace_back(kind, std::vector<Tensor>(index_.size()));
    it = std::prev(state_.end());
  }
  Tensor& t = it->second[index_.at(p.name)];
  if (!t.defined()) {
    t = scalar_state(kind) ? zeros({}, {DType::f32, p.tensor.device()})
                           : zeros(p.tensor.shape(), {p.tensor.dtype(), p.tensor.device()});
  }
  return t;
}

StateDict Optimizer::state_dict() const {
  StateDict out;
  out.emplace_back("step", scalar_tensor(static_cast<double>(step_count_), {DType::i64}));
  for (const std::string& kind : state_names()) {
    const auto it =
        std::find_if(state_.begin(), state_.end(), [&](const auto& e) { return e.first == kind; });
    if (it == state_.end()) continue;
    size_t i = 0;
    for (const ParamGroup& g : groups_) {
      for (const NamedParameter& p : g.params) {
        if (it->second[i].defined()) out.emplace_back(kind + "." + p.name, it->second[i]);
        ++i;
      }
    }
  }
  return out;
}

std::vector<Optimizer::LoadTarget> Optimizer::load_targets(const StateDict& saved,
                                                           int64_t* step) const {
  std::map<std::string, const NamedParameter*> by_name;
  for (const ParamGroup& g : groups_) {
    for (const NamedParameter& p : g.params) by_name[p.name] = &p;
  }
  const std::vector<std::string> kinds = state_names();
  std::vector<LoadTarget> targets;
  std::optional<int64_t> found_step;
  for (const auto& [key, t] : saved) {
    if (key == "step") {
      TS_CHECK(t.dtype() == DType::i64 && t.numel() == 1, "[", name(),
               "] state \"step\": expected one i64, found ", dtype_name(t.dtype()), " ",
               shape_str(t.shape()));
      found_step = t.contiguous().data_ptr<int64_t>()[0];
      continue;
    }
    const size_t dot = key.find('.');
    const std::string kind = key.substr(0, dot);
    std::string known;
    for (const std::string& k : kinds) known += (known.empty() ? "" : ", ") + k;
    TS_CHECK(dot != std::string::npos && std::count(kinds.begin(), kinds.end(), kind) == 1, "[",
             name(), "] unexpected optimizer state \"", key,
             "\"; expected <kind>.<parameter name> with kind one of: ", known);
    const auto it = by_name.find(key.substr(dot + 1));
    TS_CHECK(it != by_name.end(), "[", name(), "] optimizer state \"", key,
             "\" names no parameter of this model");
    const Tensor& p = it->second->tensor;
    const Shape want_shape = scalar_state(kind) ? Shape{} : p.shape();
    const DType want_dtype = scalar_state(kind) ? DType::f32 : p.dtype();
    TS_CHECK(t.shape() == want_shape && t.dtype() == want_dtype, "[", name(),
             "] optimizer state \"", key, "\": expected ", dtype_name(want_dtype), " ",
             shape_str(want_shape), ", found ", dtype_name(t.dtype()), " ", shape_str(t.shape()));
    targets.push_back({kind, it->second, t});
  }
  TS_CHECK(found_step.has_value(), "[", name(), "] optimizer state has no \"step\"");
  *step = *found_step;
  return targets;
}

void Optimizer::load_state_dict(const StateDict& saved) {
  begin_load(saved);
  load_part(saved, [](const NamedParameter&) { return true; });
}

void Optimizer::check_state_dict(const StateDict& saved) const {
  int64_t step = 0;
  load_targets(saved, &step);
}

void Optimizer::begin_load(const StateDict& saved) {
  int64_t step = 0;
  load_targets(saved, &step);  // validates everything, so that a bad one changes nothing
  state_.clear();
  step_count_ = step;
}

void Optimizer::load_part(const StateDict& saved, const ParamSelection& selected) {
  int64_t step = 0;
  for (const LoadTarget& t : load_targets(saved, &step)) {
    if (selected(*t.param)) state(t.kind, *t.param).copy_(t.value);
  }
}

}  // namespace tessera::optim
