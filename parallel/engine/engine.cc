#include "parallel/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <set>
#include <string>
#include <utility>

#include "autograd/ops.h"
#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "core/logging.h"
#include "parallel/compression/onebit_schedule.h"
#include "parallel/engine/model_parallel_state.h"
#include "parallel/engine/model_stage.h"

namespace tessera::parallel {
namespace {

// A batch tensor on the training device. A CUDA transfer is queued from pinned memory, so
// the host goes on queuing the forward without waiting for the device (Note [Pinned host
// memory] in core/cuda_runtime.h); the pinned copy may be dropped at once. A tensor already there
// is used as it is.
Tensor to_device(const Tensor& host, Device device) {
  if (!device.is_cuda() || !host.defined() || host.device() == device) return host;
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

// The micro-batches on the training device, for the pipeline executor, which feeds them to
// the stage as they are.
std::vector<pipeline::MicroBatch> to_device(const std::vector<pipeline::MicroBatch>& batches,
                                            Device device) {
  std::vector<pipeline::MicroBatch> out;
  out.reserve(batches.size());
  for (const pipeline::MicroBatch& b : batches) {
    out.push_back({to_device(b.inputs, device), to_device(b.labels, device)});
  }
  return out;
}

// Adds a loss to the running sum `total` (f64 on the loss's device). Losses stay on the
// device until the end of the step: reading each one would make the host wait for the
// device after every micro-batch.
void accumulate(Tensor& total, const Tensor& loss) {
  NoGradGuard no_grad;
  const Tensor l = loss.detach().to(DType::f64);
  total = total.defined() ? add(total, l) : l;
}

// The parameters of `groups` that `take` accepts, moved into groups of their own (same rate
// and decay; empty ones left out).
std::vector<optim::ParamGroup> take_params(std::vector<optim::ParamGroup>& groups,
                                           const std::function<bool(const std::string&)>& take) {
  std::vector<optim::ParamGroup> taken;
  for (optim::ParamGroup& g : groups) {
    optim::ParamGroup mine{{}, g.lr, g.weight_decay};
    std::vector<NamedParameter> kept;
    for (NamedParameter& p : g.params) (take(p.name) ? mine.params : kept).push_back(std::move(p));
    g.params = std::move(kept);
    if (!mine.params.empty()) taken.push_back(std::move(mine));
  }
  return taken;
}

// Appends the entries of `from` whose keys `to` lacks.
void add_missing(StateDict& to, const StateDict& from) {
  std::set<std::string> have;
  for (const auto& [key, t] : to) have.insert(key);
  for (const auto& [key, t] : from) {
    if (have.insert(key).second) to.emplace_back(key, t);
  }
}

// Every tensor of `state` on the CPU (checkpoint files are written from host memory).
StateDict on_cpu(StateDict state) {
  for (auto& [name, t] : state) t = t.to(Device::cpu());
  return state;
}

}  // namespace

Engine::Engine(const EngineConfig& config, TrainableModel& model,
               std::vector<optim::ParamGroup> param_groups, Device device, Communicator& data,
               ParallelGroups* groups, Communicator* device_data, Communicator* expert_data)
    : config_(config),
      model_(model),
      device_(device),
      data_(data),
      groups_(groups),
      gradient_group_(device_data ? *device_data : data),
      expert_data_(expert_data) {
  TS_CHECK(groups == nullptr || groups->data.get() == &data,
           "[engine] expected `data` to be the 3D groups' data group, found another communicator");
  TS_CHECK(gradient_group_.size() == data.size() && gradient_group_.rank() == data.rank(),
           "[engine] expected the device group to have the data-parallel group's ranks, found "
           "rank ",
           gradient_group_.rank(), " of ", gradient_group_.size(), " against rank ", data.rank(),
           " of ", data.size());
  const ModelCapabilities can = model.capabilities();
  const bool pipelined = groups && groups->grid.pipe_size() > 1;
  TS_CHECK(!pipelined || can.pipeline, "[engine] ", groups ? groups->grid.pipe_size() : 1,
           " pipeline stages: expected a model that can be split into stages, found one that "
           "cannot");
  TS_CHECK(!(groups && groups->grid.model_size() > 1) || can.tensor_slicing,
           "[engine] tensor slicing over ", groups ? groups->grid.model_size() : 1,
           " ranks: expected a model that can be sliced, found one that cannot");
  // Initialized in f32 on the CPU (the same weights everywhere), then placed.
  model.to(device, config.mixed_precision.dtype);
  ExpertParameters experts;  // Note [Expert parameters] in parallel/zero/zero_optimizer.h
  if (expert_data != nullptr) {
    TS_CHECK(groups == nullptr,
             "[engine] expert parallelism with a pipeline or tensor slicing: not supported by "
             "Tessera yet; expected neither with an expert-data group");
    experts.group = expert_data;
    experts.params = take_params(param_groups, [&model](const std::string& name) {
      return model.is_expert_parameter(name);
    });
    TS_CHECK(!experts.params.empty(),
             "[engine] expert parallelism: expected a model with experts (a mixture of experts), "
             "found no expert parameters");
    expert_modules_ = std::make_unique<ModuleRefs>(model.expert_modules());
    experts.modules = expert_modules_.get();
  }
  optimizer_ = std::make_unique<ZeroOptimizer>(
      gradient_group_, model, std::move(param_groups), config.optimizer, config.zero,
      config.mixed_precision,
      [&model](const std::string& name, const Tensor& out) { model.init_parameter(name, out); },
      experts);
  if (groups) {
    if (pipelined) tied_ = tied_stage_group(model, *groups->pipe);
    optimizer_->set_model_parallel_norm(*groups->pipe_model,
                                        replica_duplicates(model, *groups, tied_.get()));
    if (pipelined) {
      ZeroOptimizer& zero = *optimizer_;
      // Only the last stage's root is the loss (its seed not yet times the loss scale).
      const bool loss_stage = groups->pipe->rank() == groups->pipe->size() - 1;
      stage_ = std::make_unique<ModelStage>(
          model, [&zero, loss_stage](const Tensor& root, const Tensor& grad, bool,
                                     const Tensor& extra, const Tensor& loss_seed) {
            zero.backward_unreduced(root, grad, loss_stage, extra, loss_seed);
          });
      executor_ = std::make_unique<pipeline::PipelineExecutor>(
          *groups->pipe, *stage_,
          pipeline::PartitionedTransfers{groups->model.get(), config.pipeline.pipe_partitioned,
                                         config.pipeline.grad_partitioned},
          config.pipeline.overlap_transfers);
    }
  }
  scheduler_ = std::make_unique<optim::LrScheduler>(
      config.scheduler ? config.scheduler
                       : std::make_shared<optim::ConstantLR>(config.optimizer.lr));
}

Engine::~Engine() = default;

StepStats Engine::train_batch(const std::vector<pipeline::MicroBatch>& micro_batches) {
  const int64_t gas = config_.batch.gradient_accumulation_steps;
  TS_CHECK(static_cast<int64_t>(micro_batches.size()) == gas, "[engine] train_batch: expected ",
           gas, " micro-batches (gradient_accumulation_steps), found ", micro_batches.size());
  StepStats stats;
  // The gradients' groups: the data group's and the expert-data group's bytes.
  const auto gradient_bytes = [this] {
    return gradient_group_.stats().total_bytes_sent() +
           (expert_data_ ? expert_data_->stats().total_bytes_sent() : 0);
  };
  const int64_t bytes_before = gradient_bytes();
  if (const OneBitOptimizer* onebit = optimizer_->onebit()) {
    stats.comm = onebit_step_name(onebit->next_step_kind());
  }
  stats.lr = scheduler_->lr();
  optimizer_->set_lr(stats.lr);
  if (const std::optional<double> beta1 = scheduler_->beta1()) optimizer_->set_momentum(*beta1);
  optimizer_->zero_grad();
  model_.dropout_streams().key_for_step(step_);
  if (config_.layer_drop.enabled) {
    model_.set_layer_drop(layer_drop_theta_for_step(config_.layer_drop, step_), step_);
  }
  if (executor_) {
    // The schedule orders DeepSpeed's ReduceTiedGrads, ReduceGrads and OptimizerStep.
    bool stepped = false;
    pipeline::StepHooks hooks;
    hooks.reduce_tied_grads = [&] {
      if (tied_) reduce_tied_gradients(model_, *tied_);
    };
    hooks.reduce_grads = [&] { optimizer_->reduce_gradients(); };
    hooks.optimizer_step = [&] {
      stepped = true;
      step_optimizer(stats, Tensor());
    };
    const double loss = executor_->train_batch(to_device(micro_batches, device_), hooks);
    TS_INTERNAL_ASSERT(stepped, "the training schedule ended without an optimizer step");
    stats.loss = global_mean(loss);
  } else {
    step_optimizer(stats, data_parallel_loss(micro_batches, stats));
  }
  stats.comm_bytes = gradient_bytes() - bytes_before;
  return stats;
}

double Engine::timer_now() const {
  if (!config_.wall_clock_breakdown) return 0;
  if (device_.is_cuda()) cuda::synchronize(device_.index);  // the device's queued work counts
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Engine::step_optimizer(StepStats& stats, const Tensor& local_loss) {
  const double start = timer_now();
  model_.wait_for_communication();  // its errors surface here, before the step
  // Clipping without a host read where the step takes one pass (Note [One-pass
  // mixed-precision step] in parallel/zero/zero_optimizer.h).
  optimizer_->prepare_step(config_.gradient_clipping);
  // The loss sum crosses the data group while it is idle: clipping has settled the
  // gradients' reductions, and the step has not yet started the parameters' gathers,
  // which may travel on into the next forward (Note [Gathers after the step] in
  // parallel/zero/parameter_store.h). The pipeline path's mean comes after its schedule
  // and waits for them instead.
  const Tensor loss_sum = local_loss.defined() ? sum_over_data(local_loss) : Tensor();
  stats.attempted_loss_scale = optimizer_->loss_scaler() ? optimizer_->loss_scaler()->scale() : 1.0;
  stats.skipped = !optimizer_->step();
  stats.grad_norm = optimizer_->grad_norm();
  // Read once the step is queued: the host does not wait for the device before it.
  if (loss_sum.defined()) stats.loss = mean_of_sum(loss_sum);
  // An overflow's step counts; the schedule does not move (DeepSpeed's behaviour).
  if (!stats.skipped) scheduler_->step();
  stats.next_lr = scheduler_->lr();
  ++step_;
  stats.step_s = timer_now() - start;
}

Tensor Engine::data_parallel_loss(const std::vector<pipeline::MicroBatch>& micro_batches,
                                  StepStats& stats) {
  const size_t gas = micro_batches.size();
  Tensor loss_sum;  // f64, on the device
  for (size_t micro = 0; micro < gas; ++micro) {
    const pipeline::MicroBatch& b = micro_batches[micro];
    const double start = timer_now();
    const Tensor loss =
        model_.loss(model_.forward(to_device(b.inputs, device_)), to_device(b.labels, device_));
    accumulate(loss_sum, loss);
    const double forward_end = timer_now();
    // The mean over micro-batches, as DeepSpeed scales each micro-batch's loss by 1/GAS.
    optimizer_->backward(loss, 1.0 / static_cast<double>(gas), micro == gas - 1);
    stats.forward_s += forward_end - start;
    stats.backward_s += timer_now() - forward_end;
  }
  NoGradGuard no_grad;
  return div(loss_sum, scalar_tensor(static_cast<double>(gas), {DType::f64, device_}));
}

void Engine::reset_activation_shapes() {
  if (executor_) executor_->reset_shapes();
}

double Engine::eval_batch(const std::vector<pipeline::MicroBatch>& micro_batches) {
  TS_CHECK(!micro_batches.empty(), "[engine] eval_batch: expected micro-batches, found none");
  NoGradGuard no_grad;
  model_.eval();
  double loss = 0;
  if (executor_) {
    loss = executor_->eval_batch(to_device(micro_batches, device_));
  } else {
    Tensor total;  // f64, on the device
    for (const pipeline::MicroBatch& b : micro_batches) {
      accumulate(total, model_.loss(model_.forward(to_device(b.inputs, device_)),
                                    to_device(b.labels, device_)));
    }
    loss = total.item<double>() / static_cast<double>(micro_batches.size());
  }
  model_.train();
  return global_mean(loss);
}

double Engine::global_mean(double value) const {
  if (data_.size() == 1) return value;
  return mean_of_sum(sum_over_data(scalar_tensor(value, {DType::f64, device_})));
}

Tensor Engine::sum_over_data(const Tensor& value) const {
  if (data_.size() == 1) return value;
  optimizer_->wait_for_parameters();  // the group must be idle for a direct call
  // On the device, through the group that moves its tensors (`data` may be a CPU group).
  const Tensor t = value.clone();
  gradient_group_.all_reduce(t);
  return t;
}

double Engine::mean_of_sum(const Tensor& sum) const { return sum.item<double>() / data_.size(); }

bool Engine::first_rank() const {
  return data_.rank() == 0 && (!groups_ || (groups_->coord.pipe == 0 && groups_->coord.model == 0));
}

nlohmann::json Engine::grid_json() const {
  return {groups_ ? groups_->grid.pipe_size() : 1, data_.size(),
          groups_ ? groups_->grid.model_size() : 1};
}

nlohmann::json Engine::state_json() const {
  nlohmann::json zero = {{"stage", optimizer_->stage()}};
  if (optimizer_->sharded()) zero["layout"] = optimizer_->layout().to_json();
  nlohmann::json state = {{"step", step_},
                          {"scheduler_last_batch_iteration", scheduler_->last_batch_iteration()},
                          {"grid", grid_json()},
                          {"zero", zero}};
  if (const optim::LossScaler* scaler = optimizer_->loss_scaler()) {
    state["loss_scaler"] = scaler->state().to_json();
  }
  return state;
}

EngineCheckpoint Engine::save_state() {
  optimizer_->wait_for_parameters();  // current parameters, and the groups free for the save
  EngineCheckpoint c;
  c.rank_state = on_cpu(optimizer_->rank_state());
  // One path for every layout (Note [Data-parallel engine], Note [3D checkpoints]). A
  // data-parallel run at ZeRO 1-3 writes each rank's flat shard as it is (state.json's
  // layout reshards it); everything else is written whole: gathered over the data group by
  // the optimizer, over the model group by each parameter's placement, by the data-0,
  // model-0 rank of each stage.
  const bool own_shards = optimizer_->sharded() && !groups_;
  if (own_shards) c.optimizer_shard = optimizer_->shard_pieces(/*with_parameters=*/true);
  const bool writer = data_.rank() == 0 && (!groups_ || groups_->coord.model == 0);  // of its stage
  // The gathers are collective with groups; without, only the writer reads anything.
  if (writer || groups_) {
    const std::vector<NamedParameter> params = model_.named_parameters();
    auto whole = [&](const StateDict& mine) {
      return on_cpu(groups_ ? gather_full(mine, params, *groups_->model) : mine);
    };
    // Sharded weights (stage 3's, 16-bit runs' f32 masters at stages 1-2) are in the shards;
    // 16-bit runs save their f32 masters.
    if (!(own_shards && optimizer_->shards_parameters())) {
      c.model = whole(optimizer_->whole_parameters());
    }
    if (!own_shards) c.optimizer = whole(optimizer_->whole_state_dict());
  }
  if (!writer) c.model.clear(), c.optimizer.clear();
  if (groups_) {
    c.parts = static_cast<int>(groups_->grid.pipe_size());
    c.part = writer ? groups_->coord.pipe : -1;
  }
  if (optimizer_->experts()) save_experts(c);
  return c;
}

void Engine::save_experts(EngineCheckpoint& c) {
  ZeroOptimizer& experts = *optimizer_->experts();
  // Collective over the expert-data group where the part shards them.
  StateDict weights = experts.whole_parameters();
  StateDict state = experts.whole_state_dict();
  const int ep = data_.size() / expert_data_->size();
  c.expert_parts = ep;
  if (expert_data_->rank() != 0) return;
  c.experts = on_cpu(std::move(weights));
  c.expert_optimizer = on_cpu(std::move(state));
  c.expert_part = data_.rank() % ep;  // its expert-parallel rank (Note [Expert groups])
}

std::vector<NamedParameter> Engine::data_part_parameters() const {
  std::vector<NamedParameter> params = model_.named_parameters();
  if (optimizer_->experts() == nullptr) return params;
  std::erase_if(params,
                [this](const NamedParameter& p) { return model_.is_expert_parameter(p.name); });
  return params;
}

std::vector<NamedParameter> Engine::expert_part_parameters() const {
  std::vector<NamedParameter> params = model_.named_parameters();
  std::erase_if(params,
                [this](const NamedParameter& p) { return !model_.is_expert_parameter(p.name); });
  return params;
}

bool Engine::load_own_shard(const EngineCheckpoint& saved, const StateDict& model,
                            const EngineCounters& counters) {
  if (groups_ || !optimizer_->sharded() || saved.optimizer_shards.empty() ||
      counters.zero_layout->to_json() != optimizer_->layout().to_json()) {
    return false;
  }
  const StateDict& mine = saved.optimizer_shards.at(static_cast<size_t>(data_.rank()));
  const bool with_parameters = std::any_of(
      mine.begin(), mine.end(), [](const auto& e) { return e.first == kParameterShard; });
  // A parameter shard that this run keeps whole (f32 at stages 1-2) goes the whole way.
  if (with_parameters && !optimizer_->shards_parameters()) return false;
  if (!with_parameters) {
    // Validate-then-write: the shard is checked before the weights change.
    check_only_parameters(model, data_part_parameters(), false);
    optimizer_->check_shard(mine);
    optimizer_->load_parameters(model);
  }
  optimizer_->load_shard(mine);
  return true;
}

void Engine::load_state(const EngineCheckpoint& saved, const EngineCounters& counters) {
  TS_CHECK(saved.optimizer_shards.empty() || counters.zero_layout.has_value(),
           "[engine] the checkpoint has optimizer shards but no ZeRO layout ($.zero.layout "
           "of state.json); expected the layout that wrote them");
  // The experts' entries, wherever the saving run put them (Note [Expert checkpoints]).
  ZeroOptimizer* experts = optimizer_->experts();
  const auto is_expert = [this](const std::string& name) {
    return model_.is_expert_parameter(name);
  };
  StateDict model = saved.model;
  StateDict optimizer = saved.optimizer;
  StateDict expert_model = saved.experts;
  StateDict expert_optimizer = saved.expert_optimizer;
  // A run without an expert part takes the experts' parts into the rest below; its own shard
  // is never one of an expert-parallel run's, whose layout leaves the experts out.
  if (experts) {
    add_missing(expert_model, take_entries(model, is_expert, false));
    add_missing(expert_optimizer, take_entries(optimizer, is_expert, true));
  }
  if (!load_own_shard(saved, model, counters)) {
    // One path for every other layout: the whole per-parameter state, whatever world and
    // stage saved it (the parameter shards, where there are any, give the whole weights);
    // this rank's part of it, its stage's parameters sliced over its model group (all of
    // them, whole, without a pipeline or slicing), into the optimizer, which puts them
    // where its stage keeps them (the f32 masters, stage 3's shards). Validate-then-write:
    // both check every tensor before changing any.
    if (!saved.optimizer_shards.empty()) {
      const std::string param_prefix = std::string(kParameterShard) + ".";
      for (auto& [key, t] : whole_state(*counters.zero_layout, saved.optimizer_shards)) {
        if (key.rfind(param_prefix, 0) == 0) {
          model.emplace_back(key.substr(param_prefix.size()), t);
        } else {
          optimizer.emplace_back(key, t);
        }
      }
    }
    if (experts) {
      add_missing(expert_model, take_entries(model, is_expert, false));
      add_missing(expert_optimizer, take_entries(optimizer, is_expert, true));
    } else {
      add_missing(model, expert_model);
      add_missing(optimizer, expert_optimizer);
    }
    const std::vector<NamedParameter> params = data_part_parameters();
    const int rank = groups_ ? groups_->coord.model : 0;
    const int size = groups_ ? groups_->grid.model_size() : 1;
    if (!groups_) {
      // This rank holds the whole model: a tensor of the checkpoint that is not one of its
      // parameters' means another model saved it.
      check_only_parameters(model, params, false);
      check_only_parameters(optimizer, params, true);
    }
    optimizer_->load_parameters(take_local(model, params, rank, size, false));
    optimizer_->load_whole_state(take_local(optimizer, params, rank, size, true));
    // A checkpoint without expert parts counts the experts' steps with the others'.
    for (const auto& [key, t] : optimizer) {
      if (key == "step") add_missing(expert_optimizer, {{key, t}});
    }
  }
  // Each part checks its tensors before changing any; a bad expert part fails the resume
  // after the other parameters were loaded.
  if (experts) {
    const std::vector<NamedParameter> mine = expert_part_parameters();
    experts->load_parameters(take_local(expert_model, mine, 0, 1, false));
    experts->load_whole_state(take_local(expert_optimizer, mine, 0, 1, true));
  }
  restore_rank_state(saved.rank_state, counters.grid == grid_json());
  scheduler_->set_last_batch_iteration(counters.scheduler_last_batch_iteration);
  // An fp16 run resumes its loss scale; other checkpoints start the scaler afresh.
  if (counters.loss_scaler && optimizer_->loss_scaler()) {
    optimizer_->loss_scaler()->set_state(*counters.loss_scaler);
  }
  step_ = counters.step;
}

void Engine::restore_rank_state(const StateDict& saved, bool same_layout) {
  if (optimizer_->onebit() == nullptr) return;
  if (same_layout && !saved.empty()) {
    optimizer_->load_rank_state(saved);
    return;
  }
  // DeepSpeed's behaviour, which it always has: the error feedback starts afresh.
  optimizer_->reset_rank_state();
  if (first_rank()) {
    log_warn(
        "[engine] {}: the checkpoint {}; the per-rank error-feedback buffers (and 0/1 Adam's "
        "local state) start afresh, so this resume is not bit for bit",
        optimizer_->onebit()->name(),
        saved.empty() ? "has no per-rank state" : "was saved by another rank layout");
  }
}

}  // namespace tessera::parallel
