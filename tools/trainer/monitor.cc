#include "tools/trainer/monitor.h"

#include <filesystem>

#include "core/error.h"

namespace tessera::train {
namespace {

constexpr const char* kNeedsNetwork = "needs network access; use tensorboard or csv_monitor";

MonitorSection read_section(JsonObjectReader s) {
  MonitorSection m;
  m.enabled = s.get<bool>("enabled", false);
  m.output_path = s.get<std::string>("output_path", "");
  m.job_name = s.get<std::string>("job_name", m.job_name);
  return m;
}

// Keys of a service's section that DeepSpeed lets be a string or null.
void read_strings_or_null(JsonObjectReader& s, const std::vector<const char*>& keys) {
  for (const char* k : keys) {
    const nlohmann::json* v = s.raw(k);
    TS_CHECK(v == nullptr || v->is_null() || v->is_string(), "[config] ", s.key_path(k),
             ": expected a string or null, found ", v->dump());
  }
}

// A section of a service Tessera cannot reach: enabling it fails.
void refuse_enabled(JsonObjectReader& s) {
  TS_CHECK(!s.get<bool>("enabled", false), "[config] ", s.path(), " ", kNeedsNetwork,
           "; expected it absent or with \"enabled\": false");
}

std::string tag(const std::string& name) { return "Train/Samples/" + name; }

}  // namespace

std::string MonitorSection::folder(const std::string& default_dir) const {
  return (std::filesystem::path(output_path.empty() ? default_dir : output_path) / job_name)
      .string();
}

MonitorConfig read_monitor_config(JsonObjectReader& root) {
  MonitorConfig c;
  c.tensorboard = read_section(root.object("tensorboard"));
  c.csv = read_section(root.object("csv_monitor"));
  JsonObjectReader wandb = root.object("wandb");
  read_strings_or_null(wandb, {"group", "team", "project"});
  refuse_enabled(wandb);
  JsonObjectReader comet = root.object("comet");
  read_strings_or_null(comet,
                       {"project", "workspace", "api_key", "experiment_name", "experiment_key"});
  comet.get_in_range<int64_t>("samples_log_interval", 100, 1, int64_t{1} << 62);
  if (const nlohmann::json* online = comet.raw("online")) {
    TS_CHECK(online->is_null() || online->is_boolean(), "[config] ", comet.key_path("online"),
             ": expected true, false or null, found ", online->dump());
  }
  read_strings_or_null(comet, {"mode"});
  refuse_enabled(comet);
  return c;
}

std::vector<MonitorEvent> train_step_events(const nlohmann::json& record, int64_t train_batch_size,
                                            double next_lr, std::optional<double> loss_scale) {
  const int64_t step = record.at("step").get<int64_t>();
  const int64_t before = (step - 1) * train_batch_size, after = step * train_batch_size;
  std::vector<MonitorEvent> events = {{tag("train_loss"), record.at("loss").get<double>(), before},
                                      {tag("lr"), next_lr, after}};
  if (loss_scale) events.push_back({tag("loss_scale"), *loss_scale, after});
  const std::pair<const char*, const char*> timers[] = {{"forward_ms", "elapsed_time_ms_forward"},
                                                        {"backward_ms", "elapsed_time_ms_backward"},
                                                        {"step_ms", "elapsed_time_ms_step"}};
  for (const auto& [field, name] : timers) {
    if (record.contains(field)) events.push_back({tag(name), record[field].get<double>(), after});
  }
  for (const char* field : {"grad_norm", "tokens_per_s", "mfu", "comm_bytes", "all_to_all_bytes"}) {
    if (record.contains(field)) events.push_back({tag(field), record[field].get<double>(), after});
  }
  if (record.contains("moe")) {
    for (const nlohmann::json& block : record["moe"]) {
      const std::string b = "moe_block" + std::to_string(block.at("block").get<int64_t>());
      events.push_back({tag(b + "_aux_loss"), block.at("aux_loss").get<double>(), after});
      events.push_back({tag(b + "_dropped"), block.at("dropped").get<double>(), after});
      const nlohmann::json& tokens = block.at("tokens");
      for (size_t e = 0; e < tokens.size(); ++e) {
        events.push_back(
            {tag(b + "_expert" + std::to_string(e) + "_tokens"), tokens[e].get<double>(), after});
      }
    }
  }
  return events;
}

MonitorEvent eval_event(int64_t step, double val_loss, int64_t train_batch_size) {
  return {tag("eval_loss"), val_loss, step * train_batch_size};
}

Monitor::Monitor(const MonitorConfig& config, const std::string& default_dir,
                 int64_t keep_through) {
  if (config.tensorboard.enabled) {
    tensorboard_ = std::make_unique<TensorBoardWriter>(config.tensorboard.folder(default_dir));
    // The steps after the checkpoint are written again (Note [TensorBoard event files]).
    if (keep_through >= 0) {
      tensorboard_->add_session_start(keep_through + 1);
      tensorboard_->flush();
    }
  }
  if (config.csv.enabled) {
    csv_ = std::make_unique<CsvMonitor>(config.csv.folder(default_dir), tag(""), keep_through,
                                        std::vector<std::string>{tag("train_loss")});
  }
}

void Monitor::write_events(const std::vector<MonitorEvent>& events) {
  if (tensorboard_) {
    const double now = unix_time_now();
    for (const MonitorEvent& e : events) {
      tensorboard_->add_scalar(e.tag, static_cast<float>(e.value), e.step, now);
    }
    tensorboard_->flush();
  }
  if (csv_) {
    for (const MonitorEvent& e : events) csv_->write(e.tag, e.value, e.step);
  }
}

}  // namespace tessera::train
