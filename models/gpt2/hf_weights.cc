#include "models/gpt2/hf_weights.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <set>

#include "core/error.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "core/json.h"
#include "models/io/safetensors.h"

namespace tessera {
namespace {

constexpr std::string_view kPrefix = "transformer.";
constexpr std::string_view kLmHead = "lm_head.weight";
// Enough problems to see the pattern; a wrong config would otherwise list hundreds.
constexpr size_t kMaxProblems = 20;

// Collects problems and reports them together in one line.
class Problems {
 public:
  void add(std::string p) { items_.push_back(std::move(p)); }
  void throw_if_any(const std::string& context) const {
    if (items_.empty()) return;
    std::string msg =
        str_cat(context, ": ", items_.size(), " problem", items_.size() == 1 ? "" : "s", ": ");
    for (size_t i = 0; i < items_.size() && i < kMaxProblems; ++i) {
      msg += (i ? "; " : "") + items_[i];
    }
    if (items_.size() > kMaxProblems)
      msg += str_cat("; ... and ", items_.size() - kMaxProblems, " more");
    TS_FAIL(msg);
  }

 private:
  std::vector<std::string> items_;
};

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// The layer index of "h.<i>.<rest>", with <rest> in `rest`; -1 for other names.
int64_t layer_of(std::string_view name, std::string_view* rest = nullptr) {
  if (!starts_with(name, "h.")) return -1;
  const size_t dot = name.find('.', 2);
  if (dot == std::string_view::npos || dot == 2) return -1;
  int64_t i = -1;
  const char* first = name.data() + 2;
  const char* last = name.data() + dot;
  const auto [ptr, ec] = std::from_chars(first, last, i);
  if (ec != std::errc() || ptr != last || (*first == '0' && dot > 3)) return -1;
  if (rest) *rest = name.substr(dot + 1);
  return i;
}

// HF's causal-mask buffers, which are not parameters.
bool is_hf_buffer(std::string_view name) {
  std::string_view rest;
  return layer_of(name, &rest) >= 0 && (rest == "attn.bias" || rest == "attn.masked_bias");
}

// Weights that HF's Conv1D stores as (in, out).
bool is_conv1d_weight(std::string_view name) {
  std::string_view rest;
  return layer_of(name, &rest) >= 0 &&
         (rest == "attn.c_attn.weight" || rest == "attn.c_proj.weight" ||
          rest == "mlp.c_fc.weight" || rest == "mlp.c_proj.weight");
}

// The HF name without the optional "transformer." prefix; lm_head never has it.
std::string hf_short_name(std::string_view tessera_name) {
  return std::string(starts_with(tessera_name, kPrefix) ? tessera_name.substr(kPrefix.size())
                                                        : tessera_name);
}

// HF tensors by short name (prefix dropped, buffers skipped). Duplicates after dropping
// the prefix and undefined tensors are problems.
std::map<std::string, Tensor> index_hf(const StateDict& hf, Problems& problems) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : hf) {
    std::string s = name;
    if (starts_with(name, kPrefix)) {
      s = name.substr(kPrefix.size());
      if (s == kLmHead) {  // "transformer.lm_head.weight" is no HF name
        problems.add(str_cat("unexpected \"", name, "\""));
        continue;
      }
    }
    if (is_hf_buffer(s)) continue;
    if (!t.defined()) {
      problems.add(str_cat("\"", name, "\" is undefined"));
      continue;
    }
    if (!out.emplace(s, t).second) {
      problems.add(str_cat("\"", s, "\" given twice (with and without the \"transformer.\" ",
                           "prefix, or repeated)"));
    }
  }
  return out;
}

std::string dtype_shape(const Tensor& t) {
  return str_cat(dtype_name(t.dtype()), " ", shape_str(t.shape()));
}

// The HF shape of a Tessera parameter.
Shape hf_shape(const std::string& tessera_name, const Shape& ours, const GptConfig& cfg) {
  const std::string s = hf_short_name(tessera_name);
  if (s == "wte.weight" || s == kLmHead) return {cfg.vocab_size, cfg.n_embd};
  if (is_conv1d_weight(s)) return {ours[1], ours[0]};
  return ours;
}

StateDict hf_to_tessera_impl(const StateDict& hf, const GptConfig& cfg,
                             const std::string& context) {
  Problems problems;
  std::map<std::string, Tensor> given = index_hf(hf, problems);
  const auto expected = gpt_parameter_shapes(cfg);
  std::vector<std::pair<std::string, Tensor>> found;
  for (const auto& [name, shape] : expected) {
    const std::string s = hf_short_name(name);
    const Shape want = hf_shape(name, shape, cfg);
    const auto it = given.find(s);
    if (it == given.end()) {
      problems.add(str_cat("missing \"", s, "\" ", shape_str(want)));
      continue;
    }
    const Tensor& t = it->second;
    if (t.shape() != want || !is_floating(t.dtype())) {
      problems.add(str_cat("\"", s, "\" expected a floating tensor ", shape_str(want),
                           is_conv1d_weight(s) ? " (Conv1D (in, out))" : "", ", found ",
                           dtype_shape(t)));
    }
    found.emplace_back(name, t);
    given.erase(it);
  }
  if (cfg.tie_word_embeddings) given.erase(std::string(kLmHead));  // a copy of wte
  for (const auto& [s, t] : given) problems.add(str_cat("unexpected \"", s, "\""));
  problems.throw_if_any(context);

  NoGradGuard no_grad;
  StateDict out;
  for (auto& [name, t0] : found) {
    const Tensor t = t0.detach();
    const std::string s = hf_short_name(name);
    if (s == "wte.weight" || s == kLmHead) {
      Tensor padded = zeros({cfg.padded_vocab_size(), cfg.n_embd}, {t.dtype(), t.device()});
      padded.narrow(0, 0, cfg.vocab_size).copy_(t);
      out.emplace_back(name, padded);
    } else if (is_conv1d_weight(s)) {
      out.emplace_back(name, t.transpose(0, 1).contiguous());
    } else {
      out.emplace_back(name, t);
    }
  }
  return out;
}

// A positive integer written in decimal, or an error.
int64_t parse_positive(const std::string& text, const std::string& what) {
  int64_t v = 0;
  const char* last = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), last, v);
  TS_CHECK(ec == std::errc() && ptr == last && v > 0, "[hf_weights] ", what,
           ": expected a positive integer, found \"", text, "\"");
  return v;
}

// True when both tensors hold the same shape, dtype and bytes.
bool same_values(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor ca = a.detach().to(Device::cpu()).contiguous();
  const Tensor cb = b.detach().to(Device::cpu()).contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

}  // namespace

std::vector<std::pair<std::string, Shape>> gpt_parameter_shapes(const GptConfig& cfg) {
  const int64_t c = cfg.n_embd;
  std::vector<std::pair<std::string, Shape>> out;
  auto add = [&](const std::string& name, Shape shape) {
    out.emplace_back(name, std::move(shape));
  };
  auto add_linear = [&](const std::string& name, int64_t in, int64_t o) {
    add(name + ".weight", {o, in});
    if (cfg.bias) add(name + ".bias", {o});
  };
  auto add_ln = [&](const std::string& name) {
    add(name + ".weight", {c});
    if (cfg.bias) add(name + ".bias", {c});
  };
  add("transformer.wte.weight", {cfg.padded_vocab_size(), c});
  add("transformer.wpe.weight", {cfg.block_size, c});
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    const std::string p = str_cat("transformer.h.", i, ".");
    add_ln(p + "ln_1");
    add_linear(p + "attn.c_attn", c, 3 * c);
    add_linear(p + "attn.c_proj", c, c);
    add_ln(p + "ln_2");
    add_linear(p + "mlp.c_fc", c, 4 * c);
    add_linear(p + "mlp.c_proj", 4 * c, c);
  }
  add_ln("transformer.ln_f");
  if (!cfg.tie_word_embeddings) add(std::string(kLmHead), {cfg.padded_vocab_size(), c});
  return out;
}

void check_gpt_state_dict(const StateDict& state, const GptConfig& cfg,
                          const std::string& context) {
  Problems problems;
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, t] : state) {
    if (!given.emplace(name, &t).second) problems.add(str_cat("duplicate \"", name, "\""));
  }
  for (const auto& [name, shape] : gpt_parameter_shapes(cfg)) {
    const auto it = given.find(name);
    if (it == given.end()) {
      problems.add(str_cat("missing \"", name, "\" ", shape_str(shape)));
      continue;
    }
    const Tensor& t = *it->second;
    if (!t.defined()) {
      problems.add(str_cat("\"", name, "\" is undefined"));
    } else if (t.shape() != shape || !is_floating(t.dtype())) {
      problems.add(str_cat("\"", name, "\" expected a floating tensor ", shape_str(shape),
                           ", found ", dtype_shape(t)));
    }
    given.erase(it);
  }
  for (const auto& [name, t] : given) problems.add(str_cat("unexpected \"", name, "\""));
  problems.throw_if_any(context);
}

StateDict hf_to_tessera(const StateDict& hf, const GptConfig& cfg) {
  return hf_to_tessera_impl(hf, cfg, "[hf_weights] hf_to_tessera");
}

StateDict tessera_to_hf(const StateDict& ours, const GptConfig& cfg) {
  check_gpt_state_dict(ours, cfg, "[hf_weights] tessera_to_hf");
  NoGradGuard no_grad;
  StateDict out;
  for (const auto& [name, t0] : ours) {
    const Tensor t = t0.detach();
    const std::string s = hf_short_name(name);
    const std::string hf_name = s == kLmHead ? s : str_cat(kPrefix, s);
    if (s == "wte.weight" || s == kLmHead) {
      out.emplace_back(hf_name, t.narrow(0, 0, cfg.vocab_size).clone());
    } else if (is_conv1d_weight(s)) {
      out.emplace_back(hf_name, t.transpose(0, 1).contiguous());
    } else {
      out.emplace_back(hf_name, t);
    }
  }
  return out;
}

GptConfig infer_hf_config(const StateDict& hf, const std::map<std::string, std::string>& metadata) {
  Problems problems;
  const std::map<std::string, Tensor> given = index_hf(hf, problems);
  problems.throw_if_any("[hf_weights] infer_hf_config");
  auto get = [&](const std::string& s) -> const Tensor* {
    const auto it = given.find(s);
    return it == given.end() ? nullptr : &it->second;
  };

  GptConfig cfg;
  const Tensor* wte = get("wte.weight");
  const Tensor* wpe = get("wpe.weight");
  TS_CHECK(wte && wte->dim() == 2, "[hf_weights] infer_hf_config: expected \"wte.weight\" ",
           "(vocab_size, n_embd), found ", wte ? dtype_shape(*wte) : "none");
  TS_CHECK(wpe && wpe->dim() == 2, "[hf_weights] infer_hf_config: expected \"wpe.weight\" ",
           "(block_size, n_embd), found ", wpe ? dtype_shape(*wpe) : "none");
  cfg.vocab_size = wte->size(0);
  cfg.n_embd = wte->size(1);
  cfg.block_size = wpe->size(0);

  std::set<int64_t> layers;
  for (const auto& [s, t] : given) {
    const int64_t i = layer_of(s);
    if (i >= 0) layers.insert(i);
  }
  TS_CHECK(!layers.empty(), "[hf_weights] infer_hf_config: expected blocks \"h.0.*\", ...; ",
           "found none");
  TS_CHECK(*layers.rbegin() + 1 == static_cast<int64_t>(layers.size()),
           "[hf_weights] infer_hf_config: expected blocks h.0 to h.", layers.size() - 1,
           ", found indices up to h.", *layers.rbegin());
  cfg.n_layer = static_cast<int64_t>(layers.size());
  cfg.bias = get("h.0.ln_1.bias") != nullptr;
  const Tensor* head = get(std::string(kLmHead));
  cfg.tie_word_embeddings = head == nullptr || same_values(*head, *wte);
  cfg.n_head = 0;  // unknown from shapes

  if (const auto it = metadata.find(kGptConfigMetadataKey); it != metadata.end()) {
    const nlohmann::json doc = parse_json(it->second, kGptConfigMetadataKey);
    JsonObjectReader reader(doc, "hf_weights",
                            str_cat("metadata[\"", kGptConfigMetadataKey, "\"]"));
    const GptConfig meta = GptConfig::from_json(reader);
    reader.finish();
    auto agree = [&](const char* field, auto from_meta, auto from_shapes) {
      if (from_meta != from_shapes) {
        problems.add(str_cat(field, ": the metadata config says ", from_meta, ", the tensors say ",
                             from_shapes));
      }
    };
    agree("vocab_size", meta.vocab_size, cfg.vocab_size);
    agree("block_size", meta.block_size, cfg.block_size);
    agree("n_layer", meta.n_layer, cfg.n_layer);
    agree("n_embd", meta.n_embd, cfg.n_embd);
    agree("bias", meta.bias, cfg.bias);
    // An untied head whose values equal wte is indistinguishable from a tied one.
    if (!(meta.tie_word_embeddings == false && cfg.tie_word_embeddings && head != nullptr)) {
      agree("tie_word_embeddings", meta.tie_word_embeddings, cfg.tie_word_embeddings);
    }
    problems.throw_if_any("[hf_weights] infer_hf_config");
    return meta;
  }
  if (const auto it = metadata.find("n_head"); it != metadata.end()) {
    cfg.n_head = parse_positive(it->second, "metadata[\"n_head\"]");
  }
  return cfg;
}

StateDict load_hf_safetensors(const std::string& path, const GptConfig& cfg) {
  const SafetensorsFile file = read_safetensors(path);
  return hf_to_tessera_impl(file.tensors, cfg, str_cat("[hf_weights] ", path));
}

void save_hf_safetensors(const std::string& path, const StateDict& ours, const GptConfig& cfg) {
  const StateDict hf = tessera_to_hf(ours, cfg);
  write_safetensors(path, hf, {{"format", "pt"}, {kGptConfigMetadataKey, cfg.to_json().dump()}});
}

}  // namespace tessera
