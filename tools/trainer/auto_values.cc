#include "tools/trainer/auto_values.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <string_view>

#include "core/error.h"
#include "core/json.h"
#include "optim/config.h"

namespace tessera::train {
namespace {

using Json = nlohmann::json;

bool is_auto(const Json* v) { return v != nullptr && v->is_string() && *v == "auto"; }

// Python's == as fill_match applies it: numbers by value (1 == 1.0), arrays element-wise.
bool same_value(const Json& a, const Json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  if (a.is_array() && b.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!same_value(a[i], b[i])) return false;
    }
    return true;
  }
  return a == b;
}

// Whether fill_match may compare a and b: a value of another kind is the reader's error.
bool same_kind(const Json& a, const Json& b) {
  return (a.is_number() && b.is_number()) || (a.is_boolean() && b.is_boolean()) ||
         (a.is_array() && b.is_array()) || (a.is_string() && b.is_string());
}

// A value Tessera has for a DeepSpeed key: `value` (absent when the config gives none),
// where it comes from ("$.trainer.steps 100"), and, when absent, which key would supply it.
struct Source {
  std::optional<Json> value;
  std::string from;
  std::string missing_hint;
};

// The kinds of Tessera source values.
enum class Kind { integer, non_negative, string };

// How a key with a source is treated (transformers' fill_match / fill_only).
enum class Fill {
  match,            // "auto" filled; a concrete value must equal the source
  match_or_create,  // also written when the key is absent
  only,             // "auto" filled; a concrete value is left alone
};

class AutoFiller {
 public:
  AutoFiller(Json& doc, AutoResolution& out) : doc_(doc), out_(out) {}

  // The object at the dot-separated `path` ("" is the root), or nullptr when absent or not an
  // object; with `create`, absent objects on the way are made.
  Json* section(std::string_view path, bool create = false) {
    Json* node = &doc_;
    while (!path.empty()) {
      const size_t dot = path.find('.');
      const std::string part(path.substr(0, dot));
      if (!node->contains(part)) {
        if (!create) return nullptr;
        (*node)[part] = Json::object();
      }
      node = &(*node)[part];
      if (!node->is_object()) return nullptr;
      path = dot == std::string_view::npos ? std::string_view() : path.substr(dot + 1);
    }
    return node;
  }

  static std::string path_of(std::string_view section_path, std::string_view key) {
    std::string path = "$";
    while (!section_path.empty()) {
      const size_t dot = section_path.find('.');
      path = json_key_path(path, section_path.substr(0, dot));
      section_path =
          dot == std::string_view::npos ? std::string_view() : section_path.substr(dot + 1);
    }
    return json_key_path(path, key);
  }

  // Key `key` of the object at `section_path`, from `source` (Note ["auto" values]).
  void fill(std::string_view section_path, const std::string& key, const Source& source,
            Fill mode) {
    const std::string path = path_of(section_path, key);
    Json* s = section(section_path, mode == Fill::match_or_create && source.value.has_value());
    if (s == nullptr) return;
    const Json* current = s->contains(key) ? &(*s)[key] : nullptr;
    if (is_auto(current)) {
      if (!source.value) {
        problem(str_cat(path, " is \"auto\" and nothing here fills it; expected a value, or ",
                        source.missing_hint),
                true);
        reported_.insert(path);
        return;
      }
      (*s)[key] = *source.value;
      out_.filled.push_back(
          str_cat(path, ": \"auto\" -> ", source.value->dump(), " from ", source.from));
      return;
    }
    if (!source.value) return;
    if (current == nullptr) {
      if (mode != Fill::match_or_create) return;
      (*s)[key] = *source.value;
      out_.filled.push_back(
          str_cat(path, ": absent -> ", source.value->dump(), " from ", source.from));
      return;
    }
    if (mode != Fill::only && same_kind(*current, *source.value) &&
        !same_value(*current, *source.value)) {
      problem(str_cat(path, " is ", current->dump(), " but ", source.from, " gives ",
                      source.value->dump(),
                      "; expected the same value, or \"auto\" (Hugging Face's mismatch check)"));
    }
  }

  // A Tessera source key of $.trainer: its value when present and of kind `kind`; a value of
  // another kind is left to the reader, which reports it.
  std::optional<Json> trainer_value(const std::string& key, Kind kind) {
    const Json* trainer = section("trainer");
    if (trainer == nullptr || !trainer->contains(key)) return std::nullopt;
    const Json& v = (*trainer)[key];
    switch (kind) {
      case Kind::integer:  // 2e3 is an integer, as the reader takes it
        if (v.is_number() && v.get<double>() >= 1 && std::floor(v.get<double>()) == v.get<double>())
          return Json(static_cast<int64_t>(v.get<double>()));
        break;
      case Kind::non_negative:
        if (v.is_number() && v.get<double>() >= 0) return v;
        break;
      case Kind::string:
        if (v.is_string()) return v;
        break;
    }
    return std::nullopt;
  }

  // Records a problem; `about_auto`: an "auto" nothing fills (the message then explains
  // "auto").
  // "$.trainer.<key>", and when the key is there but trainer_value() could not take it, what
  // it holds and what was expected: the hint of an "auto" it would have filled.
  std::string source_hint(const std::string& key, const char* expected) {
    const Json* trainer = section("trainer");
    if (trainer == nullptr || !trainer->contains(key)) return "$.trainer." + key;
    return str_cat("$.trainer.", key, " as ", expected, " (found ", describe_json((*trainer)[key]),
                   ")");
  }

  void problem(std::string message, bool about_auto = false) {
    problems_.push_back(std::move(message));
    about_auto_ = about_auto_ || about_auto;
  }
  bool any_about_auto() const { return about_auto_; }
  // Whether an "auto" at `path` was reported already (it had a rule but no source).
  bool reported(const std::string& path) const { return reported_.count(path) > 0; }
  const std::vector<std::string>& problems() const { return problems_; }
  Json& doc() { return doc_; }
  AutoResolution& out() { return out_; }

 private:
  Json& doc_;
  AutoResolution& out_;
  std::vector<std::string> problems_;
  std::set<std::string> reported_;
  bool about_auto_ = false;
};

// The stage count a pipeline section gives; "auto" is 1 (DeepSpeed takes the stage count
// from its PipelineModule, never from this key).
int64_t resolve_pipeline_stages(AutoFiller& f) {
  Json* pipe = f.section("pipeline");
  if (pipe == nullptr || !pipe->contains("stages")) return 1;
  Json& stages = (*pipe)["stages"];
  if (is_auto(&stages)) {
    stages = 1;
    f.out().filled.push_back(
        "$.pipeline.stages: \"auto\" -> 1 (DeepSpeed takes the stage count from its "
        "PipelineModule, not from this key; give a number to pipeline)");
  }
  return stages.is_number_integer() ? stages.get<int64_t>() : 1;
}

void fill_batch(AutoFiller& f, int64_t world_size) {
  const int64_t stages = resolve_pipeline_stages(f);
  const Json* tp_section = f.section("tensor_parallel");
  const int64_t tp =
      tp_section && tp_section->contains("tp_size") && (*tp_section)["tp_size"].is_number_integer()
          ? (*tp_section)["tp_size"].get<int64_t>()
          : 1;
  const std::optional<Json> mbs = f.trainer_value("per_device_train_batch_size", Kind::integer);
  const std::optional<Json> gas = f.trainer_value("gradient_accumulation_steps", Kind::integer);
  f.fill("", "train_micro_batch_size_per_gpu",
         {mbs, "$.trainer.per_device_train_batch_size",
          f.source_hint("per_device_train_batch_size", "an integer >= 1")},
         Fill::match_or_create);
  f.fill("", "gradient_accumulation_steps",
         {gas, "$.trainer.gradient_accumulation_steps",
          f.source_hint("gradient_accumulation_steps", "an integer >= 1")},
         Fill::match_or_create);
  // train_batch_size: the data-parallel ranks times the (now filled) micro-batch and
  // accumulation, as DeepSpeed itself derives it.
  const Json& root = f.doc();
  const Json* micro = root.contains("train_micro_batch_size_per_gpu")
                          ? &root["train_micro_batch_size_per_gpu"]
                          : nullptr;
  const Json* accumulation =
      root.contains("gradient_accumulation_steps") ? &root["gradient_accumulation_steps"] : nullptr;
  Source global{std::nullopt, "",
                "$.trainer.per_device_train_batch_size (with "
                "$.trainer.gradient_accumulation_steps, default 1)"};
  if (micro && micro->is_number_integer() && (!accumulation || accumulation->is_number_integer()) &&
      stages * tp > 0 && world_size % (stages * tp) == 0) {
    const int64_t dp = world_size / (stages * tp);
    const int64_t a = accumulation ? accumulation->get<int64_t>() : 1;
    global.value = dp * micro->get<int64_t>() * a;
    global.from =
        str_cat(dp, " data-parallel rank(s) x micro-batch ", micro->dump(), " x accumulation ", a);
  }
  // Compared only when Tessera's keys gave a factor: otherwise DeepSpeed's own batch check
  // (resolve_batch) reports an inconsistent triple in its words.
  f.fill("", "train_batch_size", global, mbs || gas ? Fill::match : Fill::only);
  const std::optional<Json> clip = f.trainer_value("max_grad_norm", Kind::non_negative);
  f.fill("", "gradient_clipping",
         {clip, "$.trainer.max_grad_norm", f.source_hint("max_grad_norm", "a number >= 0")},
         Fill::match_or_create);
}

bool has_auto_param(const Json* section) {
  if (section == nullptr || !section->contains("params") || !(*section)["params"].is_object())
    return false;
  for (const auto& [key, value] : (*section)["params"].items()) {
    if (is_auto(&value)) return true;
  }
  return false;
}

// DeepSpeed's optimizer params from the client optimizer; returns the optimizer's lr when
// known (the scheduler's warmup_max_lr).
std::optional<Json> fill_optimizer(AutoFiller& f) {
  Json* ds = f.section("optimizer");
  const Json* client = f.section("trainer.optimizer");
  const Json* client_params = f.section("trainer.optimizer.params");
  if (ds != nullptr && has_auto_param(ds)) {
    if (client != nullptr) {
      const std::string ds_type =
          ds->contains("type") && (*ds)["type"].is_string() ? (*ds)["type"].get<std::string>() : "";
      const std::string client_type = client->contains("type") && (*client)["type"].is_string()
                                          ? (*client)["type"].get<std::string>()
                                          : "";
      if (!optim::same_optimizer_type(ds_type, client_type)) {
        f.problem(str_cat("$.optimizer.type is \"", ds_type,
                          "\" but $.trainer.optimizer.type is \"", client_type,
                          "\"; expected the same type: $.trainer.optimizer fills $.optimizer's "
                          "\"auto\" params"));
      }
    }
    // Hugging Face's four, and every other param of the client optimizer, which must then
    // agree with DeepSpeed's section or fill it (nothing of it is dropped).
    std::vector<std::string> keys = {"lr", "betas", "eps", "weight_decay"};
    if (client_params != nullptr) {
      for (const auto& [key, value] : client_params->items()) {
        if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
      }
    }
    for (const std::string& key : keys) {
      std::optional<Json> value;
      if (client_params != nullptr && client_params->contains(key)) value = (*client_params)[key];
      const std::string from = "$.trainer.optimizer.params." + key;
      f.fill("optimizer.params", key, {value, from, from}, Fill::match_or_create);
    }
    if (client != nullptr) {
      f.doc()["trainer"].erase("optimizer");
      f.out().filled.push_back(
          "$.trainer.optimizer: filled $.optimizer's \"auto\" params; the run uses $.optimizer");
    }
  }
  const Json* params = f.section("optimizer.params");
  if (params == nullptr) params = f.section("trainer.optimizer.params");
  if (params != nullptr && params->contains("lr") && (*params)["lr"].is_number())
    return (*params)["lr"];
  return std::nullopt;
}

// HF's get_warmup_steps: a count when >= 1, else a fraction of the steps, rounded up.
std::optional<Json> warmup_steps(const Json& warmup, const std::optional<Json>& steps) {
  const double w = warmup.get<double>();
  if (w >= 1) return static_cast<int64_t>(w);
  if (!steps) return std::nullopt;
  return static_cast<int64_t>(std::ceil(steps->get<double>() * w));
}

void fill_scheduler(AutoFiller& f, const std::optional<Json>& lr) {
  const std::optional<Json> steps = f.trainer_value("steps", Kind::integer);
  const std::optional<Json> warmup = f.trainer_value("warmup_steps", Kind::non_negative);
  const Json* params = f.section("scheduler.params");
  if (warmup && (params == nullptr || !params->contains("warmup_num_steps"))) {
    f.problem(
        str_cat("$.trainer.warmup_steps fills $.scheduler.params.warmup_num_steps; expected "
                "a scheduler section with that key, found ",
                params == nullptr ? "none" : "one without it"));
  }
  if (params == nullptr) return;
  f.fill("scheduler.params", "warmup_min_lr", {Json(0), "Hugging Face's rule", ""}, Fill::only);
  f.fill("scheduler.params", "warmup_max_lr",
         {lr, "the optimizer's lr", "$.optimizer.params.lr or $.trainer.optimizer.params.lr"},
         Fill::only);
  const std::string steps_hint =
      f.source_hint("steps", "an integer >= 1") +
      " (with epochs the step count is known only once the data is read)";
  std::optional<Json> w = warmup ? warmup_steps(*warmup, steps) : std::nullopt;
  f.fill("scheduler.params", "warmup_num_steps",
         {w, warmup ? str_cat("$.trainer.warmup_steps ", warmup->dump()) : "",
          warmup ? steps_hint : f.source_hint("warmup_steps", "a number >= 0")},
         Fill::match);
  f.fill("scheduler.params", "total_num_steps", {steps, "$.trainer.steps", steps_hint}, Fill::only);
}

void fill_precision(AutoFiller& f) {
  const std::optional<Json> mp = f.trainer_value("mixed_precision", Kind::string);
  std::optional<std::string> mode;
  if (mp) {
    mode = mp->get<std::string>();
    if (*mode != "no" && *mode != "fp16" && *mode != "bf16") mode.reset();  // the reader's error
  }
  const char* modes = "\"no\", \"fp16\" or \"bf16\"";
  const std::string hint =
      mp || f.section("trainer") == nullptr || !f.section("trainer")->contains("mixed_precision")
          ? str_cat("$.trainer.mixed_precision (", modes, ")")
          : f.source_hint("mixed_precision", modes);
  for (const char* dtype : {"fp16", "bf16"}) {
    std::optional<Json> on;
    if (mode) on = *mode == dtype;
    // accelerate's set_mixed_precision adds the chosen dtype's section when it is missing;
    // a section without "enabled" (DeepSpeed's default false) gets it too.
    const bool create = mode && *mode == dtype;
    f.fill(dtype, "enabled",
           {on, str_cat("$.trainer.mixed_precision \"", mode.value_or(""), "\""), hint},
           create ? Fill::match_or_create : Fill::match);
  }
  std::optional<Json> apex;
  if (mode) apex = false;
  f.fill("amp", "enabled", {apex, "Tessera, which has no Apex AMP", hint}, Fill::match);
}

void fill_zero(AutoFiller& f, int64_t hidden) {
  std::optional<Json> h2, prefetch, persistence;
  if (hidden > 0) {
    h2 = hidden * hidden;
    prefetch = static_cast<int64_t>(0.9 * static_cast<double>(hidden * hidden));
    persistence = 10 * hidden;
  }
  const std::string width = str_cat("the model's width ", hidden);
  const std::string hint = "a model section that gives its width";
  f.fill("zero_optimization", "reduce_bucket_size", {h2, width + " squared", hint}, Fill::only);
  f.fill("zero_optimization", "stage3_prefetch_bucket_size",
         {prefetch, "0.9 x " + width + " squared", hint}, Fill::only);
  f.fill("zero_optimization", "stage3_param_persistence_threshold",
         {persistence, "10 x " + width, hint}, Fill::only);
  f.fill("zero_optimization", "stage3_gather_16bit_weights_on_model_save",
         {Json(false), "accelerate's default", ""}, Fill::only);
  for (const char* offload :
       {"zero_optimization.offload_optimizer", "zero_optimization.offload_param"})
    f.fill(offload, "device", {Json("none"), "accelerate's default", ""}, Fill::only);
}

// Every "auto" left anywhere in `v` (at `path`): no rule fills it.
void report_unfilled(AutoFiller& f, const Json& v, const std::string& path) {
  if (is_auto(&v)) {
    if (f.reported(path)) return;
    f.problem(str_cat(path,
                      " is \"auto\", which Tessera fills only where Hugging Face's integration "
                      "does (configs/README.md, \"auto\" values); expected a value"),
              true);
  } else if (v.is_object()) {
    for (const auto& [key, child] : v.items()) report_unfilled(f, child, json_key_path(path, key));
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) report_unfilled(f, v[i], str_cat(path, "[", i, "]"));
  }
}

}  // namespace

AutoResolution resolve_auto_values(Json& doc, int64_t world_size, int64_t hidden_size) {
  AutoResolution out;
  if (!doc.is_object()) return out;
  AutoFiller f(doc, out);
  fill_batch(f, world_size);
  const std::optional<Json> lr = fill_optimizer(f);
  fill_scheduler(f, lr);
  fill_precision(f);
  fill_zero(f, hidden_size);
  report_unfilled(f, doc, "$");
  const std::vector<std::string>& problems = f.problems();
  if (problems.empty()) return out;
  // One problem is one line; several are listed one per line under a count.
  std::string message = "[config] ";
  if (problems.size() == 1) {
    message += problems[0];
  } else {
    message += str_cat(problems.size(), " problems with the config's values:");
    for (const std::string& p : problems) message += "\n  " + p;
  }
  if (f.any_about_auto()) {
    message +=
        "\n\"auto\" is Hugging Face's placeholder, filled in by its integration from its "
        "TrainingArguments; here Tessera's sections supply those values (configs/README.md, "
        "\"auto\" values), or give concrete ones.";
  }
  TS_FAIL(message);
}

}  // namespace tessera::train
