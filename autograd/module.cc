#include "autograd/module.h"

#include <cxxabi.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <typeinfo>

#include "autograd/record.h"
#include "core/factories.h"
#include "core/grad_mode.h"

namespace tessera {

namespace {

thread_local bool deferred_init = false;

}  // namespace

DeferredInitGuard::DeferredInitGuard() : prev_(deferred_init) { deferred_init = true; }
DeferredInitGuard::~DeferredInitGuard() { deferred_init = prev_; }
bool DeferredInitGuard::active() { return deferred_init; }

void Module::register_parameter(std::string name, Tensor& param, Placement placement) {
  TS_CHECK(param.defined(), "[Module] parameter \"", name, "\" is undefined");
  if (deferred_init) param.storage().release();
  if (!param.requires_grad()) param.set_requires_grad(true);
  params_.push_back({std::move(name), &param, placement});
}

void Module::register_buffer(std::string name, Tensor& buffer) {
  TS_CHECK(buffer.defined(), "[Module] buffer \"", name, "\" is undefined");
  buffers_.emplace_back(std::move(name), &buffer);
}

void Module::register_module(std::string name, Module& child) {
  TS_CHECK(&child != this, "[Module] a module cannot be its own child (\"", name, "\")");
  children_.emplace_back(std::move(name), &child);
}

void Module::collect(const std::string& prefix, std::vector<NamedParameter>* params,
                     StateDict* buffers) const {
  for (const ParamEntry& p : params_) {
    if (params) params->push_back({prefix + p.name, *p.tensor, p.placement});
  }
  for (const auto& [name, b] : buffers_) {
    if (buffers) buffers->emplace_back(prefix + name, *b);
  }
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", params, buffers);
}

std::vector<NamedParameter> Module::named_parameters() const {
  std::vector<NamedParameter> out;
  collect("", &out, nullptr);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (NamedParameter& p : named_parameters()) out.push_back(p.tensor);
  return out;
}

StateDict Module::state_dict() const {
  std::vector<NamedParameter> params;
  StateDict buffers;
  collect("", &params, &buffers);
  StateDict out;
  for (NamedParameter& p : params) out.emplace_back(p.name, p.tensor);
  for (auto& b : buffers) out.push_back(b);
  return out;
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  const StateDict own = state_dict();
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, t] : state) {
    TS_CHECK(given.emplace(name, &t).second, "[load_state_dict] duplicate entry \"", name, "\"");
  }
  std::string problems;
  auto note = [&](const std::string& p) { problems += (problems.empty() ? "" : "; ") + p; };
  for (const auto& [name, t] : own) {
    auto it = given.find(name);
    if (it == given.end()) {
      note(str_cat("missing \"", name, "\""));
      continue;
    }
    const Tensor& src = *it->second;
    if (src.shape() != t.shape() || src.dtype() != t.dtype()) {
      note(str_cat("\"", name, "\" expected ", dtype_name(t.dtype()), " ", shape_str(t.shape()),
                   ", found ", dtype_name(src.dtype()), " ", shape_str(src.shape())));
    }
    given.erase(it);
  }
  if (strict) {
    for (const auto& [name, t] : given) note(str_cat("unexpected \"", name, "\""));
  }
  TS_CHECK(problems.empty(), "[load_state_dict] ", problems);
  NoGradGuard no_grad;
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : state) by_name.emplace(name, &t);
  for (const auto& [name, t] : own) t.copy_(*by_name.at(name));
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::zero_grad() {
  for (NamedParameter& p : named_parameters()) p.tensor.set_grad(Tensor());
}

void Module::to(Device device, DType dtype) {
  NoGradGuard no_grad;
  std::vector<NamedParameter> params;
  StateDict buffers;
  collect("", &params, &buffers);
  for (NamedParameter& p : params) {
    if (p.tensor.dtype() == dtype && p.tensor.device() == device) continue;
    p.tensor.replace_data(p.tensor.materialized()
                              ? p.tensor.detach().to(device).to(dtype)
                              : unmaterialized(p.tensor.shape(), {dtype, device}));
  }
  for (auto& [name, b] : buffers) {
    if (b.device() != device) b.replace_data(b.detach().to(device));
  }
}

std::vector<Tensor> Module::own_parameters() const {
  std::vector<Tensor> out;
  for (const ParamEntry& p : params_) out.push_back(*p.tensor);
  return out;
}

void Module::set_hooks(const std::shared_ptr<ModuleHooks>& hooks) {
  hooks_ = hooks;
  for (auto& [name, child] : children_) child->set_hooks(hooks);
}

ModuleCall::ModuleCall(const Module& m) : module_(m), hooks_(m.hooks()), scope_(m) {
  if (hooks_) hooks_->pre_forward(module_);
}

ModuleCall::~ModuleCall() {
  if (hooks_) hooks_->post_forward(module_);
}

Tensor ModuleCall::output(const Tensor& y) const {
  if (!hooks_ || !needs_grad({&y})) return y;
  Tensor out = y;  // record() makes `out` a fresh alias of y
  record_function("module_call", {y}, {&out},
                  [hooks = std::weak_ptr<ModuleHooks>(hooks_),
                   m = &module_](const TensorList& g) -> TensorList {
                    if (const std::shared_ptr<ModuleHooks> h = hooks.lock()) h->pre_backward(*m);
                    return {g[0]};
                  });
  return out;
}

ModuleRefs::ModuleRefs(const std::vector<Module*>& modules) {
  for (size_t i = 0; i < modules.size(); ++i) register_module(std::to_string(i), *modules[i]);
}

std::string class_name(const Module& m) {
  const char* mangled = typeid(m).name();
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  std::string name = status == 0 ? demangled.get() : mangled;
  const size_t colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

}  // namespace tessera
