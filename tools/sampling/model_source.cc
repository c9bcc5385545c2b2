#include "tools/sampling/model_source.h"

#include <filesystem>

#include "core/error.h"
#include "core/json.h"
#include "models/gpt2/hf_weights.h"
#include "models/io/safetensors.h"
#include "tools/data/gpt2_bpe.h"
#include "tools/trainer/checkpoint.h"
#include "tools/trainer/run_config.h"

namespace tessera::sampling {
namespace fs = std::filesystem;
namespace {

std::string describe(const GptConfig& c) {
  return str_cat("GPT-2 ", c.n_layer, " layers, ", c.n_head, " heads, width ", c.n_embd, ", vocab ",
                 c.vocab_size, ", block ", c.block_size, ", ", c.num_parameters(), " parameters");
}

// The preset (n_layer, n_head, n_embd) that fills in n_head for Hugging Face weights.
GptConfig preset_for(const GptConfig& inferred, const std::string& name, const std::string& path) {
  if (!name.empty()) {
    const GptConfig p = GptConfig::preset(name);
    TS_CHECK(p.n_layer == inferred.n_layer && p.n_embd == inferred.n_embd, "[generate] ", path,
             " holds ", inferred.n_layer, " layers of width ", inferred.n_embd, "; --model ", name,
             " has ", p.n_layer, " of width ", p.n_embd);
    return p;
  }
  for (const char* candidate : {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"}) {
    const GptConfig p = GptConfig::preset(candidate);
    if (p.n_layer == inferred.n_layer && p.n_embd == inferred.n_embd) return p;
  }
  TS_FAIL("[generate] ", path, " does not record n_head and its ", inferred.n_layer,
          " layers of width ", inferred.n_embd,
          " match no GPT-2 preset; expected --model gpt2|gpt2-medium|gpt2-large|gpt2-xl");
}

}  // namespace

LoadedModel load_from_checkpoint(const std::string& path) {
  const std::string dir = train::resolve_checkpoint_dir(path);
  train::CheckpointContents c = train::load_checkpoint(dir, /*with_optimizer=*/false);
  const std::string state_path = (fs::path(dir) / "state.json").string();
  TS_CHECK(c.state.is_object() && c.state.contains("model") && c.state["model"].is_object(),
           "[generate] ", state_path, ": expected an object with the model config at $.model");
  const GptConfig cfg =
      GptConfig::from_json(JsonObjectReader(c.state["model"], "checkpoint", "$.model"));
  LoadedModel m;
  m.model = std::make_unique<Gpt>(cfg, /*seed=*/0);
  m.model->load_state_dict(c.model);
  m.model->eval();
  m.from_checkpoint = true;
  // The run config's own rule for data.tokenizer (given, or beside the training shards).
  // A config that no longer parses (the schema moved on) only costs the default tokenizer.
  if (!c.state.contains("config")) {
    m.no_tokenizer_reason = "holds no run config naming a tokenizer";
  } else {
    try {
      // The batch triple was resolved over the run's data-parallel world.
      const int64_t world = c.state.value("world", int64_t{1});
      m.tokenizer =
          train::parse_run_config(c.state["config"], "run config", "", world).data.tokenizer;
    } catch (const Error& e) {
      m.no_tokenizer_reason = str_cat("has a run config that does not parse (", e.what(), ")");
    }
  }
  const int64_t step = c.state.value("step", int64_t{-1});
  m.description = str_cat("checkpoint ", dir, " (step ", step, "): ", describe(cfg));
  return m;
}

LoadedModel load_from_hf(const std::string& path, const std::string& model) {
  const SafetensorsFile file = read_safetensors(path);
  GptConfig cfg = infer_hf_config(file.tensors, file.metadata);
  if (cfg.n_head == 0) {
    cfg.n_head = preset_for(cfg, model, path).n_head;
  } else if (!model.empty()) {
    const GptConfig p = preset_for(cfg, model, path);
    TS_CHECK(p.n_head == cfg.n_head, "[generate] ", path, " records ", cfg.n_head,
             " heads; --model ", model, " has ", p.n_head);
  }
  cfg.validate();
  LoadedModel m;
  m.model = std::make_unique<Gpt>(cfg, /*seed=*/0);
  m.model->load_state_dict(hf_to_tessera(file.tensors, cfg));
  m.model->eval();
  m.description = str_cat("Hugging Face weights ", path, ": ", describe(cfg));
  return m;
}

std::unique_ptr<data::Tokenizer> load_tokenizer_for(const LoadedModel& m, const std::string& path) {
  std::unique_ptr<data::Tokenizer> tok;
  if (!path.empty()) {
    tok = data::load_tokenizer(path);
  } else if (m.from_checkpoint) {
    TS_CHECK(!m.tokenizer.empty(), "[generate] the checkpoint's state.json ", m.no_tokenizer_reason,
             "; expected --tokenizer FILE");
    TS_CHECK(fs::exists(m.tokenizer), "[generate] the checkpoint's tokenizer ", m.tokenizer,
             " (the run config's data.tokenizer, relative to where training ran) does not exist; "
             "expected --tokenizer FILE");
    tok = data::load_tokenizer(m.tokenizer);
  } else {
    const std::string dir = data::Gpt2Bpe::default_dir();
    TS_CHECK(data::Gpt2Bpe::files_present(dir),
             "[generate] no tokenizer given and the GPT-2 BPE files (encoder.json, vocab.bpe) "
             "are not in ",
             dir, "; expected --tokenizer FILE or tools/setup.sh to fetch them");
    tok = std::make_unique<data::Gpt2Bpe>(data::Gpt2Bpe::from_dir(dir));
  }
  const int64_t vocab = m.model->config().vocab_size;
  TS_CHECK(tok->vocab_size() <= vocab, "[generate] the tokenizer has ", tok->vocab_size(),
           " tokens; expected at most the model's vocab_size, ", vocab);
  return tok;
}

}  // namespace tessera::sampling
