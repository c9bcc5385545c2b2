#include "tools/trainer/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>

#include "autograd/ops.h"
#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "core/logging.h"
#include "core/parallel.h"
#include "models/bert/masking.h"
#include "models/gpt2/hf_weights.h"
#include "models/gpt2/llmc_weights.h"
#include "models/gpt2/sampler.h"
#include "optim/config.h"
#include "parallel/pipeline/partition.h"
#include "tools/bench/fma_peak.h"
#include "tools/trainer/model_parallel_state.h"

namespace tessera::train {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The fraction of (query, key) blocks a sparse layout computes at `seq_len` positions.
double layout_density(const SparsityConfig& s, int64_t heads, int64_t seq_len) {
  const int64_t padded = (seq_len + s.block - 1) / s.block * s.block;
  const Tensor layout = make_sparsity_layout(s, heads, padded, /*seed=*/0);
  const std::vector<int64_t> bits = layout.to_vector<int64_t>();
  int64_t on = 0;
  for (const int64_t b : bits) on += b != 0;
  return static_cast<double>(on) / static_cast<double>(bits.size());
}

// Training FLOPs per token, PaLM appendix B: 6N + 12 L H Q T (N counts every parameter);
// a sparse layout scales the attention term by its density.
double flops_per_token(const RunConfig& c) {
  const bool bert = c.bert.has_value();
  const int64_t layers = bert ? c.bert->n_layer : c.model.n_layer;
  const int64_t heads = bert ? c.bert->n_head : c.model.n_head;
  const int64_t width = bert ? c.bert->n_embd : c.model.n_embd;
  const double params =
      static_cast<double>(bert ? c.bert->num_parameters() : c.model.num_parameters());
  const std::optional<SparsityConfig>& sparse =
      bert ? c.sparse_attention : c.model.sparse_attention;
  const double density = sparse ? layout_density(*sparse, heads, c.data.seq_len) : 1.0;
  return 6.0 * params + 12.0 * density * static_cast<double>(layers * width * c.data.seq_len);
}

std::string format_duration(double s) {
  const int64_t t = static_cast<int64_t>(s);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", static_cast<long long>(t / 3600),
                static_cast<long long>(t / 60 % 60), static_cast<long long>(t % 60));
  return buf;
}

// Tokens in the shards at `paths` (each header checked).
int64_t shard_tokens(const std::vector<std::string>& paths) {
  int64_t n = 0;
  for (const std::string& p : paths) n += data::TokenShard(p).size();
  return n;
}

// Loads `path` into `model`: Hugging Face GPT-2 safetensors, or an llm.c checkpoint (.bin).
// Loads Hugging Face safetensors or an llm.c checkpoint into `model`: all of it, or the
// stage and slices a pipeline or tensor-parallel rank holds.
void load_initial_weights(Gpt& model, const std::string& path) {
  const GptConfig& cfg = model.config();
  StateDict full;
  if (path.size() > 4 && path.substr(path.size() - 4) == ".bin") {
    LlmcCheckpoint ck = read_llmc_checkpoint(path);
    TS_CHECK(ck.config.n_layer == cfg.n_layer && ck.config.n_embd == cfg.n_embd &&
                 ck.config.padded_vocab_size() == cfg.padded_vocab_size(),
             "[train] ", path, " holds a GPT-2 with ", ck.config.n_layer, " layers, width ",
             ck.config.n_embd, ", vocab ", ck.config.vocab_size, "; the config's model has ",
             cfg.n_layer, ", ", cfg.n_embd, ", ", cfg.vocab_size);
    full = std::move(ck.state);
  } else {
    full = load_hf_safetensors(path, cfg);
  }
  const parallel::Communicator& group = model.model_group();
  if (group.size() == 1 && model.part().whole(cfg)) return model.load_state_dict(full);
  model.load_state_dict(
      take_local(full, model.named_parameters(), group.rank(), group.size(), false));
}

// Every tensor of `state` on the CPU (checkpoint files are written from host memory).
StateDict on_cpu(StateDict state) {
  for (auto& [name, t] : state) t = t.to(Device::cpu());
  return state;
}

// A batch tensor on the training device. A CUDA transfer is queued from pinned memory, so
// the host goes on queuing the forward without waiting for the device (Note [Pinned host
// memory]); the pinned copy may be dropped at once.
Tensor to_device(const Tensor& host, Device device) {
  if (!device.is_cuda()) return host;
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

// Adds a loss to the running sum `total` (f64 on the loss's device). Losses stay on the
// device until the end of the step: reading each one would make the host wait for the
// device after every micro-batch.
void accumulate(Tensor& total, const Tensor& loss) {
  NoGradGuard no_grad;
  const Tensor l = loss.detach().to(DType::f64);
  total = total.defined() ? add(total, l) : l;
}

// Dense bf16 tensor-core peak of an H100 SXM, the reference of the CUDA MFU (PaLM's MFU
// uses the hardware peak whatever the precision).
constexpr double kCudaPeakFlops = 989.4e12;

}  // namespace

namespace {

// The 3D groups when the config asks for a pipeline or tensor slicing (null otherwise).
// The world first takes the simulated link of $.simulated_network, which the groups
// split from it inherit.
std::unique_ptr<parallel::ParallelGroups> make_groups(const RunConfig& cfg,
                                                      parallel::Communicator& world) {
  world.set_simulated_link(cfg.engine.simulated_link);
  const int stages = static_cast<int>(cfg.engine.pipeline.stages);
  const int tp = static_cast<int>(cfg.engine.tensor_parallel.tp_size);
  if (stages == 1 && tp == 1) return nullptr;
  return std::make_unique<parallel::ParallelGroups>(parallel::make_parallel_groups(
      world, parallel::ProcessGrid::for_world(world.size(), stages, tp)));
}

// The names of this rank's parameters that another rank of its replica also holds:
// replicated ones on tensor-parallel ranks > 0, and the last stage's copy of the tied wte.
std::set<std::string> norm_duplicates(const Gpt& model, const parallel::ParallelGroups& g) {
  std::set<std::string> out;
  const bool tied_copy_stage = g.grid.pipe_size() > 1 && g.coord.pipe == g.grid.pipe_size() - 1;
  for (const NamedParameter& p : model.named_parameters()) {
    const bool replica = g.coord.model > 0 && p.placement.kind == Placement::Kind::replicated;
    if (replica || (tied_copy_stage && p.name == "transformer.wte.weight")) out.insert(p.name);
  }
  return out;
}

}  // namespace

Trainer::Trainer(RunConfig config, ResumeMode resume, parallel::Communicator& world,
                 parallel::Communicator* device_dp)
    : cfg_(std::move(config)),
      world_(world),
      groups_(make_groups(cfg_, world)),
      dp_(groups_ ? *groups_->data : world),
      gradient_group_(device_dp ? *device_dp : dp_) {
  TS_CHECK(gradient_group_.size() == dp_.size() && gradient_group_.rank() == dp_.rank(),
           "[train] expected the device group to have the data-parallel group's ranks, found rank ",
           gradient_group_.rank(), " of ", gradient_group_.size(), " against rank ", dp_.rank(),
           " of ", dp_.size());
  if (device_dp) device_dp->set_simulated_link(cfg_.engine.simulated_link);
  if (leader()) {
    for (const std::string& w : cfg_.warnings) log_warn("{}", w);
  }
  const TrainerConfig& t = cfg_.trainer;
  if (t.threads > 0) set_num_threads(static_cast<int>(t.threads));
  const parallel::BatchConfig& batch = cfg_.engine.batch;

  if (t.device.is_cuda()) cuda::check_device(t.device.index);
  GptPart part;
  if (groups_ && groups_->grid.pipe_size() > 1) {
    const std::vector<int> parts =
        parallel::pipeline::partition_layers(pipeline_layers(cfg_.model), groups_->grid.pipe_size(),
                                             cfg_.engine.pipeline.partition_method);
    part = part_of_stage(cfg_.model, parts, groups_->coord.pipe);
  }
  if (cfg_.bert) {
    model_ = std::make_unique<Bert>(*cfg_.bert, t.seed,
                                    cfg_.sparse_attention ? &*cfg_.sparse_attention : nullptr);
  } else {
    auto gpt = std::make_unique<Gpt>(
        cfg_.model, t.seed,
        groups_ && groups_->grid.model_size() > 1 ? groups_->model.get() : nullptr, part);
    gpt_ = gpt.get();
    model_ = std::move(gpt);
  }
  dropout_key_ = model_->dropout_generator().seed();
  model_->set_activation_checkpointing(
      cfg_.checkpoint_activations ? 1 : cfg_.engine.pipeline.activation_checkpoint_interval);
  if (!cfg_.init_from.empty()) load_initial_weights(*gpt_, cfg_.init_from);
  // Initialized in f32 on the CPU (the same weights everywhere), then placed.
  model_->to(t.device, cfg_.engine.precision);
  const optim::OptimizerConfig& oc = cfg_.engine.optimizer;
  optimizer_ = std::make_unique<parallel::ZeroOptimizer>(
      gradient_group_, *model_,
      optim::decay_groups(model_->named_parameters(), oc.lr, oc.weight_decay, t.no_decay_1d,
                          t.no_decay_names),
      oc, cfg_.engine.zero,
      parallel::MixedPrecision{cfg_.engine.precision, cfg_.engine.loss_scaler});
  if (groups_) {
    optimizer_->set_model_parallel_norm(*groups_->pipe_model, norm_duplicates(*gpt_, *groups_));
    if (groups_->grid.pipe_size() > 1) {
      parallel::ZeroOptimizer& zero = *optimizer_;
      stage_ = std::make_unique<GptPipelineStage>(
          *gpt_, [&zero](const Tensor& root, const Tensor& grad, bool) {
            zero.backward_unreduced(root, grad);
          });
      executor_ = std::make_unique<parallel::pipeline::PipelineExecutor>(*groups_->pipe, *stage_);
      tied_ = tied_stage_group(*groups_->pipe);
    }
  }
  scheduler_ = std::make_unique<optim::LrScheduler>(
      cfg_.engine.scheduler ? cfg_.engine.scheduler : std::make_shared<optim::ConstantLR>(oc.lr));

  data::LoaderOptions lo;
  lo.batch_size = batch.train_micro_batch_size_per_gpu;
  lo.seq_len = cfg_.data.seq_len;
  lo.seed = t.seed;
  lo.mode = cfg_.data.random ? data::LoaderMode::kRandom : data::LoaderMode::kSequential;
  lo.vocab_size = cfg_.bert ? cfg_.bert->vocab_size : cfg_.model.vocab_size;
  lo.rank = dp_.rank();
  lo.world_size = dp_.size();
  train_loader_ = std::make_unique<data::DataLoader>(cfg_.data.train, lo);
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

  const int64_t tokens_per_step = batch.train_batch_size * cfg_.data.seq_len;
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
           "[train] --resume: expected a "
           "checkpoint in ",
           t.checkpoint_dir, ", found no \"latest\" there");
  checkpoints_->check_writable(world_.rank());
  // One trainer per run directory (Note [Run directory locks]); taken after every check
  // above, so a run that fails them leaves no directory behind.
  if (leader()) run_lock_ = std::make_unique<RunLock>(t.log_dir);
  // Every rank must resume from the same step (or none): [max, -min] in one reduction.
  const int64_t mine = resumed ? checkpoint_step(resumed->first) : -1;
  const Tensor agree = from_vector(std::vector<int64_t>{mine, -mine}, {2});
  world_.all_reduce(agree, parallel::ReduceOp::max);
  const std::vector<int64_t> steps = agree.to_vector<int64_t>();
  TS_CHECK(steps[0] == -steps[1], "[train] rank ", world_.rank(), " found ",
           resumed ? "checkpoint step " + std::to_string(mine) : std::string("no checkpoint"),
           " in ", t.checkpoint_dir, ", but the ranks' latest steps range from ", -steps[1], " to ",
           steps[0], " (-1: none); expected every rank to see the same checkpoint");
  if (resumed) {
    restore(resumed->first, resumed->second);
    if (leader()) log_info("resumed from {} at step {}", resumed->first, step_);
  }
  if (leader()) metrics_ = std::make_unique<MetricsLog>(t.log_dir, resumed ? step_ : -1);
}

Trainer::~Trainer() = default;

nlohmann::json Trainer::model_json() const {
  if (!cfg_.bert) return cfg_.model.to_json();
  nlohmann::json j = cfg_.bert->to_json();
  if (cfg_.sparse_attention) j["sparse_attention"] = cfg_.sparse_attention->to_json();
  return j;
}

data::Batch Trainer::model_batch(const data::Batch& window, uint64_t counter) const {
  if (!cfg_.bert) return window;
  const MaskedBatch m = mask_tokens(window.inputs, *cfg_.bert, cfg_.trainer.seed, counter);
  return {m.inputs, m.targets};
}

nlohmann::json Trainer::grid_json() const {
  return {cfg_.engine.pipeline.stages, dp_.size(), cfg_.engine.tensor_parallel.tp_size};
}

nlohmann::json Trainer::state_json() const {
  nlohmann::json zero = {{"stage", optimizer_->stage()}};
  if (optimizer_->sharded()) zero["layout"] = optimizer_->layout().to_json();
  nlohmann::json state = {{"step", step_},
                          {"scheduler_last_batch_iteration", scheduler_->last_batch_iteration()},
                          {"loader", train_loader_->state().to_json()},
                          {"model", model_json()},
                          {"world", world_.size()},
                          {"grid", grid_json()},
                          {"zero", zero},
                          {"config", cfg_.json}};
  if (const optim::LossScaler* scaler = optimizer_->loss_scaler()) {
    state["loss_scaler"] = scaler->state().to_json();
  }
  return state;
}

void Trainer::restore(const std::string& dir, const CheckpointContents& c) {
  const SavedTrainerState s = read_trainer_state(c.state, dir);
  TS_CHECK(s.model == model_json(), "[train] the checkpoint's model ", s.model.dump(),
           " differs from the config's ", model_json().dump(),
           "; expected the same model to resume");
  // The optimizer state as whole per-parameter tensors, whatever world and stage saved it.
  StateDict optimizer = c.optimizer;
  if (!c.optimizer_shards.empty()) {
    TS_CHECK(s.zero_layout.has_value(),
             "[train] the checkpoint has optimizer shards but its state.json has no "
             "$.zero.layout; expected the layout that wrote them");
    optimizer = parallel::whole_state(*s.zero_layout, c.optimizer_shards);
  }
  // Validate-then-write: both check every tensor before changing any. Stage 3's
  // parameters live in the optimizer's shards; 16-bit runs load the f32 masters.
  if (model_parallel()) {
    // This rank's stage and slices of the whole checkpoint (Note [3D checkpoints]).
    const std::vector<NamedParameter> params = model_->named_parameters();
    const int rank = groups_->coord.model, size = groups_->grid.model_size();
    optimizer_->load_parameters(take_local(c.model, params, rank, size, false));
    optimizer_->load_whole_state(take_local(optimizer, params, rank, size, true));
  } else {
    if (optimizer_->stage() == 3 || optimizer_->precision() != DType::f32) {
      optimizer_->load_parameters(c.model);
    } else {
      model_->load_state_dict(c.model);
    }
    optimizer_->load_whole_state(optimizer);
  }
  // The layout that saved it: any other may resume (Note [3D checkpoints]).
  restore_rank_state(c.rank_state, s.grid == grid_json());
  scheduler_->set_last_batch_iteration(s.scheduler_last_batch_iteration);
  train_loader_->restore(s.loader);
  // An fp16 run resumes its loss scale; other checkpoints start the scaler afresh.
  if (s.loss_scaler && optimizer_->loss_scaler())
    optimizer_->loss_scaler()->set_state(*s.loss_scaler);
  step_ = s.step;
}

void Trainer::restore_rank_state(const StateDict& saved, bool same_layout) {
  if (optimizer_->onebit() == nullptr) return;
  if (same_layout && !saved.empty()) {
    optimizer_->load_rank_state(saved);
    return;
  }
  // DeepSpeed's behaviour, which it always has: the error feedback starts afresh.
  optimizer_->reset_rank_state();
  if (leader()) {
    log_warn(
        "[train] {}: the checkpoint {}; the per-rank error-feedback buffers (and 0/1 Adam's "
        "local state) start afresh, so this resume is not bit for bit",
        optimizer_->onebit()->name(),
        saved.empty() ? "has no per-rank state" : "was saved by another rank layout");
  }
}

double Trainer::train_step() {
  step_bytes_start_ = gradient_group_.stats().total_bytes_sent();
  if (const parallel::OneBitOptimizer* onebit = optimizer_->onebit()) {
    comm_path_ = parallel::onebit_step_name(onebit->next_step_kind());
  }
  const int64_t gas = cfg_.engine.batch.gradient_accumulation_steps;
  optimizer_->set_lr(scheduler_->lr());
  if (const std::optional<double> beta1 = scheduler_->beta1()) optimizer_->set_momentum(*beta1);
  optimizer_->zero_grad();
  key_dropout(step_);
  if (executor_) return finish_step(pipeline_step());
  Tensor loss_sum;  // f64, on the device
  for (int64_t micro = 0; micro < gas; ++micro) {
    const uint64_t counter = (step_ * gas + micro) * dp_.size() + dp_.rank();
    const data::Batch b = model_batch(train_loader_->next(), counter);
    const Device device = cfg_.trainer.device;
    const Tensor loss =
        model_->loss(model_->forward(to_device(b.inputs, device)), to_device(b.targets, device));
    accumulate(loss_sum, loss);
    // The mean over micro-batches, as DeepSpeed scales each micro-batch's loss by 1/GAS.
    optimizer_->backward(loss, 1.0 / static_cast<double>(gas), micro == gas - 1);
  }
  return finish_step(loss_sum.item<double>() / static_cast<double>(gas));
}

double Trainer::pipeline_step() {
  const int64_t gas = cfg_.engine.batch.gradient_accumulation_steps;
  std::vector<parallel::pipeline::MicroBatch> micro_batches;
  for (int64_t micro = 0; micro < gas; ++micro) {
    const data::Batch b = train_loader_->next();
    micro_batches.push_back({b.inputs, b.targets});
  }
  const double loss = executor_->train_batch(micro_batches);
  // DeepSpeed's ReduceTiedGrads, then ReduceGrads (Note [ZeRO under model parallelism]).
  if (tied_) reduce_tied_gradients(*gpt_, *tied_);
  optimizer_->reduce_gradients();
  return loss;
}

double Trainer::finish_step(double loss) {
  last_grad_norm_ = optimizer_->clip_grad_norm(cfg_.engine.gradient_clipping);
  const double attempted_scale =
      optimizer_->loss_scaler() ? optimizer_->loss_scaler()->scale() : 1.0;
  if (optimizer_->step()) {
    scheduler_->step();
  } else if (leader()) {
    // DeepSpeed's message; the step counts, the scheduler does not move.
    log_info("OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {}, reducing to {}",
             attempted_scale, optimizer_->loss_scaler()->scale());
  }
  ++step_;
  const double mean = global_mean(loss);
  step_bytes_ = gradient_group_.stats().total_bytes_sent() - step_bytes_start_;
  return mean;
}

void Trainer::key_dropout(int64_t step) {
  model_->dropout_generator() = Generator(hash_name(dropout_key_, "step " + std::to_string(step)));
}

double Trainer::global_mean(double value) const {
  if (dp_.size() == 1) return value;
  const Tensor t = scalar_tensor(value, {DType::f64});
  dp_.all_reduce(t);
  return t.item<double>() / dp_.size();
}

double Trainer::evaluate() {
  NoGradGuard no_grad;
  model_->eval();
  val_loader_->reset();
  if (executor_) {
    std::vector<parallel::pipeline::MicroBatch> batches;
    for (int64_t i = 0; i < cfg_.trainer.eval_batches; ++i) {
      const data::Batch b = val_loader_->next();
      batches.push_back({b.inputs, b.targets});
    }
    const double loss = executor_->eval_batch(batches);
    model_->train();
    return global_mean(loss);
  }
  Tensor total;  // f64, on the device
  for (int64_t i = 0; i < cfg_.trainer.eval_batches; ++i) {
    // Counters of their own, the same at every evaluation (Note [Masked-LM runs]).
    const uint64_t counter = (uint64_t{1} << 62) + i * dp_.size() + dp_.rank();
    const data::Batch b = model_batch(val_loader_->next(), counter);
    const Device device = cfg_.trainer.device;
    accumulate(total, model_->loss(model_->forward(to_device(b.inputs, device)),
                                   to_device(b.targets, device)));
  }
  model_->train();
  return global_mean(total.item<double>() / static_cast<double>(cfg_.trainer.eval_batches));
}

void Trainer::save_model_parallel_checkpoint() {
  // Note [3D checkpoints]: whole tensors, gathered over the data group (optimizer state)
  // and the model group (both), written per stage by its data-0, model-0 rank.
  const std::vector<NamedParameter> params = model_->named_parameters();
  parallel::Communicator& model_group = *groups_->model;
  CheckpointContents c;
  c.model = on_cpu(gather_full(optimizer_->whole_parameters(), params, model_group));
  c.optimizer = on_cpu(gather_full(optimizer_->whole_state_dict(), params, model_group));
  c.parts = static_cast<int>(groups_->grid.pipe_size());
  c.part = groups_->coord.data == 0 && groups_->coord.model == 0 ? groups_->coord.pipe : -1;
  if (c.part < 0) c.model.clear(), c.optimizer.clear();
  c.rank_state = on_cpu(optimizer_->rank_state());
  if (leader()) c.state = state_json();
  const std::string dir = checkpoints_->save(step_, c, &world_);
  if (leader()) log_info("checkpoint {}", dir);
}

void Trainer::save_checkpoint() {
  if (model_parallel()) return save_model_parallel_checkpoint();
  CheckpointContents c;
  const bool partitioned = optimizer_->stage() == 3;
  const bool mixed = optimizer_->precision() != DType::f32;
  if (leader()) {
    // 16-bit runs save their f32 master weights.
    if (!partitioned)
      c.model = on_cpu(mixed ? optimizer_->whole_parameters() : model_->state_dict());
    c.state = state_json();
  }
  if (optimizer_->sharded()) {
    c.optimizer_shards.push_back(on_cpu(optimizer_->state_dict()));
    if (partitioned)
      c.optimizer_shards.back().emplace_back(kParameterShard, optimizer_->parameter_shard());
  } else if (leader()) {
    c.optimizer = on_cpu(optimizer_->state_dict());
  }
  c.rank_state = on_cpu(optimizer_->rank_state());
  const std::string dir = checkpoints_->save(step_, c, &world_);
  if (leader()) log_info("checkpoint {}", dir);
}

void Trainer::sample_text() {
  const SampleConfig& s = cfg_.trainer.sample;
  model_->eval();
  const std::vector<int32_t> prompt = tokenizer_->encode(s.prompt);
  SamplingOptions so{s.temperature, s.top_k, s.top_p, cfg_.trainer.seed};
  const std::vector<int32_t> ids = sample(*gpt_, prompt, s.tokens, so);
  model_->train();
  if (!leader()) return;
  std::fprintf(stdout, "---- sample (%lld tokens) ----\n%s%s\n----\n",
               static_cast<long long>(s.tokens), s.prompt.c_str(), tokenizer_->decode(ids).c_str());
  std::fflush(stdout);
}

TrainResult Trainer::run() {
  const TrainerConfig& t = cfg_.trainer;
  const auto start = Clock::now();
  const int64_t tokens_per_step = cfg_.engine.batch.train_batch_size * cfg_.data.seq_len;
  // Every rank measures its own peak; MFU compares against all ranks' together.
  const bool on_cuda = t.device.is_cuda();
  const double peak =
      (on_cuda ? kCudaPeakFlops : bench::measure_fma_peak(num_threads())) * world_.size();
  const double flops = flops_per_token(cfg_);
  if (leader()) {
    const bool bert = cfg_.bert.has_value();
    const std::optional<SparsityConfig>& sparse =
        bert ? cfg_.sparse_attention : cfg_.model.sparse_attention;
    log_info(
        "model: {} {} layers, {} heads, width {}, {} parameters, {} attention; {} steps of {} "
        "tokens; {} data-parallel rank(s) x {} pipeline stage(s) x {} tensor-parallel rank(s), "
        "ZeRO stage {}, {} on {}; {}",
        bert ? "BERT (masked LM)" : "GPT-2", bert ? cfg_.bert->n_layer : cfg_.model.n_layer,
        bert ? cfg_.bert->n_head : cfg_.model.n_head, bert ? cfg_.bert->n_embd : cfg_.model.n_embd,
        bert ? cfg_.bert->num_parameters() : cfg_.model.num_parameters(),
        sparse ? fmt::format("block-sparse ({}, block {})", sparsity_mode_name(sparse->mode),
                             sparse->block)
               : std::string("dense"),
        total_steps_, tokens_per_step, dp_.size(), cfg_.engine.pipeline.stages,
        cfg_.engine.tensor_parallel.tp_size, optimizer_->stage(),
        dtype_name(optimizer_->precision()), t.device.str(),
        on_cuda ? std::string("MFU against 989 TFLOP/s (H100 SXM dense bf16)")
                : fmt::format("FMA peak {:.0f} GFLOP/s on {} threads per rank",
                              peak / world_.size() / 1e9, num_threads()));
  }
  gradient_group_.reset_stats();
  if (groups_) groups_->pipe->reset_stats(), groups_->model->reset_stats();
  const bool bar = leader() && ::isatty(STDERR_FILENO) != 0;
  TrainResult result;
  double window_time = 0.0, train_time = 0.0;
  int64_t window_steps = 0, timed_steps = 0;
  const int64_t first = step_;
  while (step_ < total_steps_) {
    const auto t0 = Clock::now();
    const double loss = train_step();
    const double dt = seconds_since(t0);
    TS_CHECK(std::isfinite(loss), "[train] step ", step_, ": the loss is ", loss,
             "; expected a finite number (lower the learning rate or enable gradient_clipping)");
    result.last_loss = loss;
    window_time += dt;
    ++window_steps;
    if (step_ > first + 1) train_time += dt, ++timed_steps;  // the first step warms caches
    const double step_s = timed_steps > 0 ? train_time / timed_steps : dt;
    const double tok_s = static_cast<double>(tokens_per_step) / (window_time / window_steps);
    const double mfu = tok_s * flops / peak;
    nlohmann::json rec = {{"kind", "train"},
                          {"step", step_},
                          {"loss", loss},
                          {"lr", optimizer_->lr()},
                          {"grad_norm", last_grad_norm_},
                          {"tokens_per_s", tok_s},
                          {"mfu", mfu},
                          {"comm_bytes", step_bytes_},
                          {"elapsed_s", seconds_since(start)}};
    if (!comm_path_.empty()) rec["comm"] = comm_path_;
    if (leader()) metrics_->write(rec);
    const bool report = step_ % cfg_.engine.steps_per_print == 0 || step_ == total_steps_;
    if (leader() && report) {
      if (bar) std::fprintf(stderr, "\r\033[K");
      log_info(
          "step {}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | {:.0f} tok/s | MFU "
          "{:.1f}% | ETA {}{}",
          step_, total_steps_, loss, optimizer_->lr(), last_grad_norm_, tok_s, 100 * mfu,
          format_duration(step_s * static_cast<double>(total_steps_ - step_)),
          comm_path_.empty() ? "" : " | comm " + comm_path_);
    } else if (bar) {
      const int width = 30;
      const int filled = static_cast<int>(width * step_ / total_steps_);
      std::fprintf(stderr, "\r[%s%s] %lld/%lld loss %.4f", std::string(filled, '#').c_str(),
                   std::string(width - filled, '.').c_str(), static_cast<long long>(step_),
                   static_cast<long long>(total_steps_), loss);
      std::fflush(stderr);
    }
    if (report) window_time = 0.0, window_steps = 0;
    const bool last = step_ == total_steps_;
    if (val_loader_ && ((t.eval_interval > 0 && step_ % t.eval_interval == 0) || last)) {
      const double val = evaluate();
      result.val_loss = val;
      if (leader()) {
        metrics_->write({{"kind", "eval"},
                         {"step", step_},
                         {"val_loss", val},
                         {"elapsed_s", seconds_since(start)}});
        log_info("step {}: val loss {:.4f}", step_, val);
      }
    }
    if ((t.checkpoint_interval > 0 && step_ % t.checkpoint_interval == 0) || last) {
      save_checkpoint();
    }
  }
  result.steps = step_;
  // Stage 3 gathers parameters in every forward: every rank samples, rank 0 prints.
  if (model_parallel() && t.sample.tokens > 0 && leader()) {
    log_info(
        "no sample: the model is split over ranks; sample from the checkpoint with "
        "tools/generate");
  } else if ((leader() || optimizer_->stage() == 3) && t.sample.tokens > 0 && tokenizer_) {
    sample_text();
  }
  result.seconds = seconds_since(start);
  if (leader()) {
    log_info("done: {} steps in {:.1f} s{}", step_, result.seconds,
             result.val_loss ? fmt::format(", val loss {:.4f}", *result.val_loss) : "");
    if (dp_.size() > 1) {
      const parallel::ModelStateBytes m = optimizer_->model_state_bytes();
      log_info("rank 0 model state: {:.1f} MB (params {:.1f}, grads {:.1f}, optimizer {:.1f})",
               m.total() / 1e6, m.params / 1e6, m.grads / 1e6, m.optimizer / 1e6);
      const int64_t steps = std::max<int64_t>(step_ - first, 1);
      log_info("rank 0 communication, {} steps: {:.2f} MB sent per step", steps,
               static_cast<double>(gradient_group_.stats().total_bytes_sent()) / steps / 1e6);
      std::istringstream lines(gradient_group_.stats().summary());
      for (std::string line; std::getline(lines, line);) log_info("  {}", line);
    }
    if (groups_) {
      const int64_t steps = std::max<int64_t>(step_ - first, 1);
      log_info(
          "rank 0 bytes sent per step: data group {:.3f} MB, pipe group {:.3f} MB, model "
          "group {:.3f} MB",
          static_cast<double>(gradient_group_.stats().total_bytes_sent()) / steps / 1e6,
          static_cast<double>(groups_->pipe->stats().total_bytes_sent()) / steps / 1e6,
          static_cast<double>(groups_->model->stats().total_bytes_sent()) / steps / 1e6);
    }
  }
  return result;
}

}  // namespace tessera::train
