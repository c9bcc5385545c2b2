#include "tools/trainer/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "autograd/module.h"
#include "core/clock.h"
#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "core/logging.h"
#include "core/parallel.h"
#include "kernels/cpu/bf16_gemm.h"
#include "optim/config.h"
#include "tools/perf/fma_peak.h"
#include "tools/trainer/progress.h"

namespace tessera::train {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

// Tokens in the shards at `paths` (each header checked).
int64_t shard_tokens(const std::vector<std::string>& paths) {
  int64_t n = 0;
  for (const std::string& p : paths) n += data::TokenShard(p).size();
  return n;
}

// The 3D groups when the config asks for a pipeline or tensor slicing (null otherwise).
std::unique_ptr<parallel::ParallelGroups> make_groups(const RunConfig& cfg,
                                                      parallel::Communicator& world) {
  const int stages = static_cast<int>(cfg.engine.pipeline.stages);
  const int tp = static_cast<int>(cfg.engine.tensor_parallel.tp_size);
  if (stages == 1 && tp == 1) return nullptr;
  return std::make_unique<parallel::ParallelGroups>(parallel::make_parallel_groups(
      world, parallel::ProcessGrid::for_world(world.size(), stages, tp)));
}

// This rank's place in the grid for its model.
ModelPlacement placement(const RunConfig& cfg, const parallel::ParallelGroups* groups) {
  ModelPlacement p;
  if (!groups) return p;
  p.stages = groups->grid.pipe_size();
  p.stage = groups->coord.pipe;
  p.partition_method = cfg.engine.pipeline.partition_method;
  if (groups->grid.model_size() > 1) p.model_group = groups->model.get();
  p.overlap_model_comm = cfg.engine.tensor_parallel.overlap_comm;
  p.model_batch_split = cfg.engine.tensor_parallel.batch_split;
  return p;
}

}  // namespace

void apply_run_environment(const RunConfig& config, parallel::Communicator& world,
                           parallel::Communicator* device_world) {
  if (config.trainer.threads > 0) set_num_threads(static_cast<int>(config.trainer.threads));
  world.set_simulated_link(config.engine.simulated_link);
  if (device_world) device_world->set_simulated_link(config.engine.simulated_link);
}

Trainer::Trainer(RunConfig config, ResumeMode resume, parallel::Communicator& world,
                 parallel::Communicator* device_world)
    : cfg_(std::move(config)),
      world_(world),
      groups_(make_groups(cfg_, device_world ? *device_world : world)),
      dp_(groups_ ? *groups_->data : world) {
  // Expert parallelism has no pipeline or slicing (GptSpec::check_layout): the groups split
  // the data group, which is the world, on the device where there is one.
  if (const int64_t ep = cfg_.model->expert_parallel_size(); ep > 1) {
    expert_groups_ =
        parallel::make_expert_groups(device_world ? *device_world : world, static_cast<int>(ep));
  }
  if (leader()) {
    for (const std::string& w : cfg_.warnings) log_warn("{}", w);
    for (const std::string& line : cfg_.auto_filled) log_info("config: {}", line);
  }
  const TrainerConfig& t = cfg_.trainer;
  if (t.device.is_cuda()) cuda::check_device(t.device.index);
  {
    // ZeRO-3 builds the model partitioned (Note [Partitioned construction] in
    // autograd/module.h): each rank only ever holds its shard and one whole parameter.
    // Pretrained weights load into a whole model.
    std::optional<DeferredInitGuard> partitioned;
    if (cfg_.engine.zero.stage == 3 && cfg_.init_from.empty()) partitioned.emplace();
    ModelPlacement where = placement(cfg_, groups_.get());
    where.expert_group = expert_groups_.expert.get();
    model_ = cfg_.model->build(t.seed, where);
  }
  model_->set_activation_checkpointing(
      cfg_.checkpoint_activations ? 1 : cfg_.engine.pipeline.activation_checkpoint_interval,
      parallel::make_checkpoint_policy(cfg_.engine.activation_checkpointing,
                                       groups_ ? groups_->model.get() : nullptr, t.device,
                                       checkpoint_times_));
  if (!cfg_.init_from.empty()) cfg_.model->load_pretrained(*model_, cfg_.init_from);
  const optim::OptimizerConfig& oc = cfg_.engine.optimizer;
  engine_ = std::make_unique<parallel::Engine>(
      cfg_.engine, *model_,
      optim::decay_groups(model_->named_parameters(), oc.lr, oc.weight_decay, t.no_decay_1d,
                          t.no_decay_names),
      t.device, dp_, groups_.get(), groups_ ? nullptr : device_world,
      expert_groups_.expert_data.get());

  data::LoaderOptions lo;
  lo.batch_size = cfg_.engine.batch.train_micro_batch_size_per_gpu;
  lo.seq_len = cfg_.data.seq_len;
  lo.seed = t.seed;
  lo.mode = cfg_.data.random ? data::LoaderMode::kRandom : data::LoaderMode::kSequential;
  lo.vocab_size = cfg_.model->vocab_size();
  lo.rank = dp_.rank();
  lo.world_size = dp_.size();
  train_loader_ = std::make_unique<data::DataLoader>(cfg_.data.train, lo);
  if (cfg_.engine.curriculum.enabled) curriculum_.emplace(cfg_.engine.curriculum);
  if (!cfg_.data.val.empty()) {
    data::LoaderOptions vo = lo;
    vo.mode = data::LoaderMode::kSequential;
    val_loader_ = std::make_unique<data::DataLoader>(cfg_.data.val, vo);
  }
  if (fs::exists(cfg_.data.tokenizer)) {
    tokenizer_ = data::load_tokenizer(cfg_.data.tokenizer);
    TS_CHECK(tokenizer_->vocab_size() <= lo.vocab_size, "[train] ", cfg_.data.tokenizer, " has ",
             tokenizer_->vocab_size(), " tokens; expected at most model.vocab_size (",
             lo.vocab_size, ")");
  } else if (t.sample.tokens > 0) {
    TS_FAIL("[train] trainer.sample needs a tokenizer; expected ", cfg_.data.tokenizer,
            " (data.tokenizer), found no file");
  }

  const int64_t tokens_per_step = cfg_.engine.batch.train_batch_size * cfg_.data.seq_len;
  total_steps_ = t.epochs
                     ? static_cast<int64_t>(std::ceil(
                           *t.epochs * static_cast<double>(shard_tokens(train_loader_->shards())) /
                           static_cast<double>(tokens_per_step)))
                     : t.steps;

  checkpoints_ = std::make_unique<CheckpointDir>(t.checkpoint_dir, t.keep_last);
  // The newest committed checkpoint that loads (Note [Resume fallback]).
  std::optional<std::pair<std::string, CheckpointContents>> resumed;
  if (resume != ResumeMode::never) {
    resumed =
        checkpoints_->load_newest(world_.rank(), [](const std::string& w) { log_warn("{}", w); });
  }
  TS_CHECK(resume != ResumeMode::required || resumed.has_value(),
           "[train] --resume: expected a checkpoint in ", t.checkpoint_dir,
           ", found no \"latest\" there");
  checkpoints_->check_writable(world_.rank());
  // One trainer per run directory (Note [Run directory locks]); taken after every check
  // above, so a run that fails them leaves no directory behind.
  if (leader()) run_lock_ = std::make_unique<RunLock>(t.log_dir);
  check_same_checkpoint(world_, resumed ? checkpoint_step(resumed->first) : -1, t.checkpoint_dir);
  if (resumed) {
    restore(resumed->first, resumed->second);
    if (leader()) log_info("resumed from {} at step {}", resumed->first, engine_->global_steps());
  }
  if (leader()) {
    metrics_ = std::make_unique<MetricsLog>(t.log_dir, resumed ? engine_->global_steps() : -1);
    if (cfg_.monitors.enabled()) {
      monitor_ = std::make_unique<Monitor>(
          cfg_.monitors, t.log_dir,
          resumed ? engine_->global_steps() * cfg_.engine.batch.train_batch_size : -1);
    }
  }
}

Trainer::~Trainer() = default;

std::vector<parallel::pipeline::MicroBatch> Trainer::micro_batches(data::DataLoader& loader,
                                                                   int64_t count,
                                                                   uint64_t first_counter,
                                                                   int64_t tokens) const {
  std::vector<parallel::pipeline::MicroBatch> out;
  for (int64_t i = 0; i < count; ++i) {
    const data::Batch window = loader.next();
    const uint64_t counter = first_counter + i * dp_.size() + dp_.rank();
    const auto first = [&](const Tensor& t) {  // (B, T) -> (B, tokens)
      return tokens > 0 && tokens < t.size(1) ? t.narrow(1, 0, tokens).contiguous() : t;
    };
    out.push_back(cfg_.model->example(first(window.inputs), first(window.targets),
                                      cfg_.trainer.seed, counter));
  }
  return out;
}

int64_t Trainer::all_to_all_bytes() const {
  if (!expert_groups_.expert) return 0;
  return expert_groups_.expert->stats()[parallel::CommOp::all_to_all].bytes_sent;
}

void Trainer::restore(const std::string& dir, const CheckpointContents& c) {
  const SavedTrainerState s = read_trainer_state(c.state, dir);
  const nlohmann::json model = cfg_.model->to_json();
  // The experts' placement (ep_size) may change: the engine reshards them.
  TS_CHECK(cfg_.model->without_placement(s.model) == cfg_.model->without_placement(model),
           "[train] the checkpoint's model ", s.model.dump(), " differs from the config's ",
           model.dump(), "; expected the same model to resume");
  // The layout that saved it: any other may resume (Note [3D checkpoints]).
  engine_->load_state(c, s);
  train_loader_->restore(s.loader);
  if (curriculum_ && s.curriculum_difficulty) curriculum_->set_current(*s.curriculum_difficulty);
}

std::string Trainer::profile_report(const FlopsProfiler& profiler, const parallel::StepStats& s,
                                    int64_t seq_len) const {
  ProfileContext c;
  c.step = cfg_.flops_profiler.profile_step;
  c.world = world_.size();
  c.data_parallel = dp_.size();
  c.model_parallel = cfg_.engine.pipeline.stages * cfg_.engine.tensor_parallel.tp_size;
  c.micro_batch = cfg_.engine.batch.train_micro_batch_size_per_gpu;
  c.forwards = cfg_.engine.batch.gradient_accumulation_steps;
  c.backward_s = s.backward_s;
  c.step_s = s.step_s;
  // The model's training FLOPs per token are 3 forwards' (ModelSpec::flops_per_token).
  c.analytic_fwd_flops = cfg_.model->flops_per_token(seq_len) / 3 *
                         static_cast<double>(c.micro_batch * seq_len) /
                         static_cast<double>(c.model_parallel);
  return profiler.report(cfg_.flops_profiler, c);
}

void Trainer::use_seq_len(int64_t seq_len) {
  if (seq_len != batch_seq_len_) engine_->reset_activation_shapes();
  batch_seq_len_ = seq_len;
}

double Trainer::evaluate() {
  use_seq_len(cfg_.data.seq_len);  // evaluation is on whole windows
  val_loader_->reset();
  // Counters of their own, the same at every evaluation (Note [Masked-LM runs]).
  return engine_->eval_batch(
      micro_batches(*val_loader_, cfg_.trainer.eval_batches, uint64_t{1} << 62));
}

void Trainer::save_checkpoint() {
  CheckpointContents c;
  static_cast<parallel::EngineCheckpoint&>(c) = engine_->save_state();
  if (leader()) {
    c.state = engine_->state_json();
    c.state["loader"] = train_loader_->state().to_json();
    c.state["model"] = cfg_.model->to_json();
    c.state["world"] = world_.size();
    c.state["config"] = cfg_.json;
    if (curriculum_) c.state["curriculum_difficulty"] = curriculum_->current();
  }
  const std::string dir = checkpoints_->save(engine_->global_steps(), c, &world_);
  engine_->checkpoint_written();
  if (leader()) log_info("checkpoint {}", dir);
}

void Trainer::sample_text() {
  const SampleConfig& s = cfg_.trainer.sample;
  model_->eval();
  const std::vector<int32_t> prompt = tokenizer_->encode(s.prompt);
  SamplingOptions so{s.temperature, s.top_k, s.top_p, cfg_.trainer.seed};
  const std::vector<int32_t> ids = cfg_.model->generate(*model_, prompt, s.tokens, so);
  model_->train();
  if (!leader()) return;
  std::fprintf(stdout, "---- sample (%lld tokens) ----\n%s%s\n----\n",
               static_cast<long long>(s.tokens), s.prompt.c_str(), tokenizer_->decode(ids).c_str());
  std::fflush(stdout);
}

bool Trainer::cpu_bf16() const {
  return !cfg_.trainer.device.is_cuda() && cfg_.engine.mixed_precision.dtype == DType::bf16 &&
         kernels::cpu::kHaveBf16Gemm;
}

void Trainer::log_run(double peak_flops) const {
  const bool on_cuda = cfg_.trainer.device.is_cuda();
  const parallel::ZeroConfig& zero = cfg_.engine.zero;
  std::string offloaded;
  if (zero.offload_optimizer.device == parallel::OffloadOptimizerConfig::Device::nvme) {
    offloaded = " (optimizer state on NVMe in " + zero.offload_optimizer.nvme_path;
  } else if (zero.offload_optimizer.device == parallel::OffloadOptimizerConfig::Device::cpu &&
             on_cuda) {
    offloaded = " (optimizer state in host memory";
  }
  if (zero.offload_param.device == parallel::OffloadParamConfig::Device::nvme) {
    offloaded += (offloaded.empty() ? " (" : ", ") + std::string("16-bit parameters on NVMe in ") +
                 zero.offload_param.nvme_path;
  }
  if (!offloaded.empty()) offloaded += ")";
  const std::string experts =
      expert_groups_.expert
          ? fmt::format(" (experts split over groups of {})", expert_groups_.expert->size())
          : std::string();
  log_info(
      "model: {}; {} steps of {} tokens; {} data-parallel rank(s){} x {} pipeline stage(s) x {} "
      "tensor-parallel rank(s), ZeRO stage {}{}, {} on {}; {}",
      cfg_.model->describe(), total_steps_, cfg_.engine.batch.train_batch_size * cfg_.data.seq_len,
      dp_.size(), experts, cfg_.engine.pipeline.stages, cfg_.engine.tensor_parallel.tp_size,
      engine_->optimizer().stage(), offloaded, dtype_name(engine_->optimizer().precision()),
      cfg_.trainer.device.str(),
      !on_cuda ? fmt::format("{} peak {:.0f} GFLOP/s on {} threads per rank",
                             cpu_bf16() ? "bf16 GEMM" : "FMA", peak_flops / world_.size() / 1e9,
                             num_threads())
      : peak_flops > 0
          ? fmt::format("MFU against {:.0f} TFLOP/s per GPU (dense bf16 tensor cores)",
                        peak_flops / world_.size() / 1e12)
          : std::string("no MFU: no dense bf16 peak is known for this GPU's architecture"));
}

TrainResult Trainer::run() {
  const TrainerConfig& t = cfg_.trainer;
  const auto start = Clock::now();
  const int64_t gas = cfg_.engine.batch.gradient_accumulation_steps;
  // Every rank measures its own peak, of the arithmetic its products run on; MFU compares
  // against all ranks' together.
  const double peak =
      (t.device.is_cuda() ? cuda::dense_bf16_peak_flops(cuda::device_info(t.device.index))
       : cpu_bf16()       ? perf::measure_bf16_peak(num_threads())
                          : perf::measure_fma_peak(num_threads())) *
      world_.size();
  if (leader()) log_run(peak);
  engine_->gradient_group().reset_stats();
  if (groups_) groups_->pipe->reset_stats(), groups_->model->reset_stats();
  if (expert_groups_.expert)
    expert_groups_.expert->reset_stats(), expert_groups_.expert_data->reset_stats();
  ThroughputMeter meter(peak);
  ProgressReporter progress(leader(), total_steps_, cfg_.engine.steps_per_print);
  StepTimes times;                                          // wall_clock_breakdown
  CheckpointProfile checkpoint_profile(checkpoint_times_);  // activation_checkpointing.profile
  TrainResult result;
  const int64_t first = engine_->global_steps();
  // f(), its error naming step n: the one line a failed run ends with (a collective that timed
  // out names its operation, group and missing ranks itself).
  const auto at_step = [](int64_t n, const auto& f) {
    try {
      return f();
    } catch (const Error& e) {
      throw Error(str_cat("[train] step ", n, ": ", e.what()));
    }
  };
  for (int64_t step = first; step < total_steps_;) {
    const auto t0 = Clock::now();
    const int64_t all_to_all_before = all_to_all_bytes();
    // The step's sequence length: the curriculum's (DeepSpeed updates it before each
    // training forward, with t = global_steps + 1), or the data's.
    const int64_t seq_len = curriculum_ ? curriculum_->update(step + 1) : cfg_.data.seq_len;
    use_seq_len(seq_len);
    // Note [Flops profiler]: rank 0 watches this step's forwards.
    const bool profiled =
        leader() && cfg_.flops_profiler.enabled && step == cfg_.flops_profiler.profile_step;
    std::optional<FlopsProfiler> profiler;
    std::optional<ForwardObserverGuard> observing;
    if (profiled) observing.emplace(profiler.emplace(*model_));
    const parallel::StepStats s = at_step(step + 1, [&] {
      return engine_->train_batch(
          micro_batches(*train_loader_, gas, step * gas * dp_.size(), seq_len));
    });
    observing.reset();
    if (profiled) publish_report(cfg_.flops_profiler, profile_report(*profiler, s, seq_len));
    step = engine_->global_steps();
    const int64_t tokens = cfg_.engine.batch.train_batch_size * seq_len;
    meter.add_step(seconds_since(t0), tokens,
                   static_cast<double>(tokens) * cfg_.model->flops_per_token(seq_len));
    if (s.skipped && leader()) {
      // DeepSpeed's message; the step counts, the schedule does not move.
      log_info("OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {}, reducing to {}",
               s.attempted_loss_scale, engine_->optimizer().loss_scaler()->scale());
    }
    TS_CHECK(std::isfinite(s.loss), "[train] step ", step, ": the loss is ", s.loss,
             "; expected a finite number (lower the learning rate or enable gradient_clipping)");
    result.last_loss = s.loss;
    // Taken on every rank, so that none keeps counting: rank 0's are logged.
    const std::vector<parallel::ExpertLoad> expert_load = model_->take_expert_load();
    if (leader()) {
      nlohmann::json rec = {{"kind", "train"},
                            {"step", step},
                            {"loss", s.loss},
                            {"lr", s.lr},
                            {"grad_norm", s.grad_norm},
                            {"tokens_per_s", meter.tokens_per_s()},
                            {"mfu", meter.mfu()},
                            {"comm_bytes", s.comm_bytes},
                            {"elapsed_s", seconds_since(start)}};
      if (!s.comm.empty()) rec["comm"] = s.comm;
      if (curriculum_) rec["seq_len"] = seq_len;
      if (cfg_.engine.wall_clock_breakdown) {
        rec["forward_ms"] = s.forward_s * 1e3;
        rec["backward_ms"] = s.backward_s * 1e3;
        rec["step_ms"] = s.step_s * 1e3;
      }
      if (expert_groups_.expert) rec["all_to_all_bytes"] = all_to_all_bytes() - all_to_all_before;
      // Mixture-of-experts blocks: this rank's tokens per expert over the step's
      // micro-batches, dropped choices, capacity and mean load-balancing loss.
      for (const parallel::ExpertLoad& load : expert_load) {
        rec["moe"].push_back({{"block", load.block},
                              {"tokens", load.tokens},
                              {"dropped", load.dropped},
                              {"capacity", load.capacity},
                              {"aux_loss", load.aux_loss / static_cast<double>(load.passes)}});
      }
      metrics_->write(rec);
      if (monitor_) {
        const optim::LossScaler* scaler = engine_->optimizer().loss_scaler();
        monitor_->write_events(
            train_step_events(rec, cfg_.engine.batch.train_batch_size, s.next_lr,
                              scaler ? std::optional<double>(scaler->scale()) : std::nullopt));
      }
    }
    if (cfg_.engine.wall_clock_breakdown) times.add(s);
    checkpoint_profile.add_step();
    if (progress.show(step, s, meter)) {
      meter.start_window();
      if (cfg_.engine.wall_clock_breakdown) {
        const std::string line = times.report();
        if (leader()) log_info("{}", line);
      }
      if (cfg_.engine.activation_checkpointing.profile) {
        const std::string line = checkpoint_profile.report();
        if (leader()) log_info("{}", line);
      }
    }
    const bool last = step == total_steps_;
    if (val_loader_ && ((t.eval_interval > 0 && step % t.eval_interval == 0) || last)) {
      result.val_loss = at_step(step, [&] { return evaluate(); });
      if (leader()) {
        metrics_->write({{"kind", "eval"},
                         {"step", step},
                         {"val_loss", *result.val_loss},
                         {"elapsed_s", seconds_since(start)}});
        if (monitor_) {
          monitor_->write_events(
              {eval_event(step, *result.val_loss, cfg_.engine.batch.train_batch_size)});
        }
        log_info("step {}: val loss {:.4f}", step, *result.val_loss);
      }
    }
    if ((t.checkpoint_interval > 0 && step % t.checkpoint_interval == 0) ||
        (last && t.checkpoint_interval >= 0)) {
      at_step(step, [&] { save_checkpoint(); });
    }
  }
  result.steps = engine_->global_steps();
  // The last step's parameters, arriving in the background with overlap_comm at stages 1-2
  // (Note [Gathers after the step] in parallel/zero/parameter_store.h), before sampling and
  // the communication report read them.
  engine_->optimizer().wait_for_parameters();
  // Stage 3 gathers parameters in every forward, and split experts trade tokens in every
  // forward: every rank samples, rank 0 prints.
  if (engine_->model_parallel() && t.sample.tokens > 0 && leader()) {
    log_info(
        "no sample: the model is split over ranks; sample from the checkpoint with "
        "tools/generate");
  } else if ((leader() || engine_->optimizer().stage() == 3 || expert_groups_.expert) &&
             t.sample.tokens > 0 && tokenizer_) {
    sample_text();
  }
  result.seconds = seconds_since(start);
  if (leader()) {
    log_info("done: {} steps in {:.1f} s{}", result.steps, result.seconds,
             result.val_loss ? fmt::format(", val loss {:.4f}", *result.val_loss) : "");
    log_memory(engine_->optimizer(), cfg_.trainer.device);
    log_communication(engine_->gradient_group(), groups_.get(), expert_groups_,
                      std::max<int64_t>(result.steps - first, 1));
  }
  return result;
}

}  // namespace tessera::train
