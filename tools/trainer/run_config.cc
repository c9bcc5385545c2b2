#include "tools/trainer/run_config.h"

#include <filesystem>
#include <limits>

#include "core/error.h"
#include "models/model_kinds.h"
#include "parallel/compression/onebit_config.h"
#include "tools/trainer/auto_values.h"

namespace tessera::train {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

DataConfig read_data(JsonObjectReader d, int64_t block_size) {
  DataConfig c;
  c.train = d.required<std::string>("train");
  c.val = d.get<std::string>("val", "");
  c.tokenizer = d.get<std::string>(
      "tokenizer", (std::filesystem::path(c.train).parent_path() / "tokenizer.json").string());
  c.random = d.get_one_of("sampling", "random", {"random", "sequential"}) == "random";
  c.seq_len = d.get_in_range<int64_t>("seq_len", block_size, 1, block_size);
  return c;
}

TrainerConfig read_trainer(JsonObjectReader t, const std::string& run_dir) {
  TrainerConfig c;
  const std::optional<int64_t> steps = t.optional<int64_t>("steps");
  c.epochs = t.optional<double>("epochs");
  c.eval_interval = t.get_in_range<int64_t>("eval_interval", 0, 0, kMax);
  c.eval_batches = t.get_in_range<int64_t>("eval_batches", c.eval_batches, 1, kMax);
  c.seed = static_cast<uint64_t>(t.get_in_range<int64_t>("seed", 1337, 0, kMax));
  c.log_dir = t.get<std::string>("log_dir", run_dir);
  c.checkpoint_dir = t.get<std::string>("checkpoint_dir", run_dir + "/checkpoints");
  c.checkpoint_interval = t.get_in_range<int64_t>("checkpoint_interval", 0, -1, kMax);
  c.keep_last = t.get_in_range<int64_t>("keep_last", c.keep_last, 0, kMax);
  c.threads = t.get_in_range<int64_t>("threads", 0, 0, 4096);
  const std::string device = t.get<std::string>("device", "cpu");
  try {
    c.device = Device::parse(device);
  } catch (const Error&) {
    TS_FAIL("[config] ", t.key_path("device"),
            ": expected \"cpu\", \"cuda\" or \"cuda:N\", found \"", device, "\"");
  }
  c.no_decay_1d = t.get<bool>("no_decay_1d", true);
  c.no_decay_names = t.get<std::vector<std::string>>("no_decay_names", {});
  // Hugging Face's TrainingArguments' part: they fill DeepSpeed's keys (resolve_auto_values,
  // which has used them already); checked here like every other key.
  t.get_in_range<int64_t>("per_device_train_batch_size", 1, 1, kMax);
  t.get_in_range<int64_t>("gradient_accumulation_steps", 1, 1, kMax);
  t.get_in_range<double>("max_grad_norm", 0.0, 0.0, 1e30);
  t.get_in_range<double>("warmup_steps", 0.0, 0.0, 1e18);
  t.get_one_of("mixed_precision", "no", {"no", "fp16", "bf16"});
  JsonObjectReader s = t.object("sample");
  c.sample.tokens = s.get_in_range<int64_t>("tokens", 0, 0, kMax);
  c.sample.prompt = s.get<std::string>("prompt", c.sample.prompt);
  c.sample.temperature = s.get_in_range<double>("temperature", 1.0, 1e-6, 100.0);
  c.sample.top_k = s.get_in_range<int64_t>("top_k", 0, 0, kMax);
  c.sample.top_p = s.get_in_range<double>("top_p", 1.0, 1e-6, 1.0);
  // Every key of the section has been read: a misspelled key (`"step": 100`) is the error to
  // report, not "neither steps nor epochs" that follows from it.
  t.finish();
  TS_CHECK(steps.has_value() != c.epochs.has_value(), "[config] ", t.path(),
           ": expected exactly one of \"steps\" and \"epochs\", found ",
           steps ? "both" : "neither");
  if (steps) {
    TS_CHECK(*steps >= 1, "[config] ", t.key_path("steps"), ": expected an integer >= 1, found ",
             *steps);
    c.steps = *steps;
  } else {
    TS_CHECK(*c.epochs > 0, "[config] ", t.key_path("epochs"), ": expected a number > 0, found ",
             *c.epochs);
  }
  return c;
}

// The run's choices that the model kind must support (ModelSpec::features()), and the
// layout that must fit the model.
void check_model_run(const RunConfig& c) {
  const ModelSpec& m = *c.model;
  const ModelFeatures f = m.features();
  const int64_t tp = c.engine.tensor_parallel.tp_size, stages = c.engine.pipeline.stages;
  const bool data_parallel_only = !f.modes.pipeline && !f.modes.tensor_slicing;
  const std::string trains =
      "the " + m.type() + " model trains data-parallel (with ZeRO) and cannot be ";
  TS_CHECK(f.modes.pipeline || stages == 1, "[config] $.pipeline.stages: ",
           data_parallel_only ? trains : "the " + m.type() + " model cannot be ",
           "split into pipeline stages; expected 1, found ", stages);
  TS_CHECK(f.modes.tensor_slicing || tp == 1, "[config] $.tensor_parallel.tp_size: ",
           data_parallel_only ? trains : "the " + m.type() + " model cannot be ",
           "sliced; expected 1, found ", tp);
  TS_CHECK(f.pretrained_weights || c.init_from.empty(), "[config] $.model.init_from: the ",
           m.type(), " model starts from its own initialization; expected no init_from, found \"",
           c.init_from, "\"");
  TS_CHECK(f.generation || c.trainer.sample.tokens == 0, "[config] $.trainer.sample.tokens: the ",
           m.type(), " model does not generate text; expected 0, found ", c.trainer.sample.tokens);
  TS_CHECK(!c.flops_profiler.enabled ||
               (!c.checkpoint_activations && c.engine.pipeline.activation_checkpoint_interval == 0),
           "[config] $.flops_profiler: it counts the ops a forward records for backward, and a "
           "checkpointed forward records none (its recomputation in backward would be counted "
           "instead); expected no activation checkpointing with it");
  if (c.engine.layer_drop.enabled) {
    TS_CHECK(
        f.layer_drop, "[config] $.progressive_layer_drop: the ", m.type(),
        " model does not skip layers (GPT without MoE blocks and BERT do); expected it disabled");
    TS_CHECK(!c.checkpoint_activations && c.engine.pipeline.activation_checkpoint_interval == 0,
             "[config] $.progressive_layer_drop: a recomputed layer would draw its keep again "
             "(DeepSpeed's example ignores layer drop there); expected no activation "
             "checkpointing with it");
  }
  m.check_layout(stages, tp);
}

// The model section's width for the "auto" sizes that follow it, or 0 when the section is
// missing or invalid (the full parse reports that).
int64_t model_width(const nlohmann::json& doc) {
  if (!doc.contains("model") || !doc["model"].is_object()) return 0;
  try {
    JsonObjectReader model(doc["model"], "config", "$.model");
    model.has("checkpoint_activations");  // read by parse_run_config itself
    model.has("init_from");
    return parse_model_spec(model, std::nullopt)->hidden_size();
  } catch (const Error&) {
    return 0;
  }
}

}  // namespace

RunConfig parse_run_config(const nlohmann::json& doc, const std::string& source,
                           const std::string& default_run_dir, int64_t world_size) {
  TS_CHECK(doc.is_object(), "[config] ", source, ": expected a JSON object at the top, found ",
           describe_json(doc));
  RunConfig c;
  c.source = source;
  c.json = doc;
  nlohmann::json resolved = doc;
  c.auto_filled = resolve_auto_values(resolved, world_size, model_width(doc)).filled;
  JsonObjectReader root(resolved, "config");
  // Every problem the sections have is reported at once (Note [One pass] in core/json.h).
  root.collect_errors();
  try {
    JsonObjectReader trainer = root.object("trainer");
    parallel::ClientSections client;
    if (trainer.has("optimizer")) client.optimizer = trainer.object("optimizer");
    if (trainer.has("scheduler")) client.scheduler = trainer.object("scheduler");
    c.engine = parallel::parse_engine_config(root, client);
    JsonObjectReader model = root.required_object("model");
    c.checkpoint_activations = model.get<bool>("checkpoint_activations", false);
    c.init_from = model.get<std::string>("init_from", "");
    std::optional<SparsityConfig> sparse;
    if (root.has("sparse_attention")) {
      sparse = SparsityConfig::from_json(root.object("sparse_attention"));
    }
    c.model = parse_model_spec(model, sparse);
    c.data = read_data(root.required_object("data"), c.model->block_size());
    c.trainer = read_trainer(trainer, default_run_dir);
    c.monitors = read_monitor_config(root);
    c.flops_profiler = read_flops_profiler_config(root);
    // DeepSpeed times the phases for the profiler's latencies (runtime/config.py).
    if (c.flops_profiler.enabled) c.engine.wall_clock_breakdown = true;
    root.finish();
  } catch (const Error&) {
    // A check that read a collected problem's fallback may fail as its consequence: the
    // collected problems are the ones to report (Note [One pass] in core/json.h).
    root.throw_if_collected();
    throw;
  }
  // Cross-key checks come after finish(): a misspelt key is the error to report, not the
  // inconsistency its default causes.
  parallel::finish_engine_config(c.engine, world_size);
  check_model_run(c);
  if (const parallel::CurriculumConfig& cl = c.engine.curriculum; cl.enabled) {
    int64_t longest = cl.max_difficulty;
    for (const int64_t d : cl.difficulty) longest = std::max(longest, d);
    TS_CHECK(longest <= c.data.seq_len, "[config] $.curriculum_learning: its sequences reach ",
             longest, " tokens; expected at most data.seq_len, ", c.data.seq_len,
             " (the curriculum shortens the training windows)");
  }
  parallel::check_comm_backend(c.engine.optimizer, c.trainer.device.is_cuda());
  TS_CHECK(!c.engine.activation_checkpointing.any() || c.checkpoint_activations ||
               c.engine.pipeline.activation_checkpoint_interval > 0,
           "[config] $.activation_checkpointing: its options act on recomputed segments, and "
           "none are recomputed; expected model.checkpoint_activations true or "
           "pipeline.activation_checkpoint_interval > 0 with them (Megatron's "
           "--checkpoint-activations)");
  TS_CHECK(!c.checkpoint_activations || c.engine.pipeline.activation_checkpoint_interval == 0,
           "[config] $.pipeline.activation_checkpoint_interval: model.checkpoint_activations ",
           "already checkpoints every block; expected one of the two");
  c.warnings = root.warnings();
  return c;
}

RunConfig load_run_config(const std::string& path, int64_t world_size) {
  const nlohmann::json doc = parse_json_file(path);
  const std::string stem = std::filesystem::path(path).stem().string();
  return parse_run_config(doc, path, ".runs/" + stem, world_size);
}

}  // namespace tessera::train
