#include "tools/trainer/progress.h"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/allocator.h"
#include "core/logging.h"

namespace tessera::train {
namespace {

// "h:mm:ss".
std::string format_duration(double s) {
  const int64_t t = static_cast<int64_t>(s);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", static_cast<long long>(t / 3600),
                static_cast<long long>(t / 60 % 60), static_cast<long long>(t % 60));
  return buf;
}

}  // namespace

ThroughputMeter::ThroughputMeter(double peak_flops) : peak_flops_(peak_flops) {}

void ThroughputMeter::add_step(double seconds, int64_t tokens, double flops) {
  window_s_ += seconds;
  window_tokens_ += static_cast<double>(tokens);
  window_flops_ += flops;
  if (steps_ > 0) timed_s_ += seconds;  // the first step warms caches
  ++steps_;
  last_s_ = seconds;
}

void ThroughputMeter::start_window() { window_s_ = window_tokens_ = window_flops_ = 0; }

double ThroughputMeter::tokens_per_s() const {
  return window_s_ > 0 ? window_tokens_ / window_s_ : 0;
}

double ThroughputMeter::mfu() const {
  return peak_flops_ > 0 && window_s_ > 0 ? window_flops_ / window_s_ / peak_flops_ : 0;
}

double ThroughputMeter::step_seconds() const {
  return steps_ > 1 ? timed_s_ / static_cast<double>(steps_ - 1) : last_s_;
}

ProgressReporter::ProgressReporter(bool leader, int64_t total_steps, int64_t steps_per_print)
    : leader_(leader),
      bar_(leader && ::isatty(STDERR_FILENO) != 0),
      total_steps_(total_steps),
      steps_per_print_(steps_per_print) {}

bool ProgressReporter::show(int64_t step, const parallel::StepStats& s,
                            const ThroughputMeter& meter) {
  const bool report = step % steps_per_print_ == 0 || step == total_steps_;
  if (!leader_) return report;
  if (report) {
    if (bar_) std::fprintf(stderr, "\r\033[K");
    log_info(
        "step {}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | {:.0f} tok/s | MFU "
        "{:.1f}% | ETA {}{}",
        step, total_steps_, s.loss, s.lr, s.grad_norm, meter.tokens_per_s(), 100 * meter.mfu(),
        format_duration(meter.step_seconds() * static_cast<double>(total_steps_ - step)),
        s.comm.empty() ? "" : " | comm " + s.comm);
  } else if (bar_) {
    const int width = 30;
    const int filled = static_cast<int>(width * step / total_steps_);
    std::fprintf(stderr, "\r[%s%s] %lld/%lld loss %.4f", std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), static_cast<long long>(step),
                 static_cast<long long>(total_steps_), s.loss);
    std::fflush(stderr);
  }
  return report;
}

void log_communication(const parallel::Communicator& gradients,
                       const parallel::ParallelGroups* groups,
                       const parallel::ExpertGroups& experts, int64_t steps) {
  const double per_step = static_cast<double>(gradients.stats().total_bytes_sent()) / steps / 1e6;
  if (gradients.size() > 1) {
    log_info("rank 0 communication, {} steps: {:.2f} MB sent per step", steps, per_step);
    std::istringstream lines(gradients.stats().summary());
    for (std::string line; std::getline(lines, line);) log_info("  {}", line);
  }
  if (groups) {
    log_info(
        "rank 0 bytes sent per step: data group {:.3f} MB, pipe group {:.3f} MB, model group "
        "{:.3f} MB",
        per_step, static_cast<double>(groups->pipe->stats().total_bytes_sent()) / steps / 1e6,
        static_cast<double>(groups->model->stats().total_bytes_sent()) / steps / 1e6);
  }
  if (experts.expert) {
    log_info(
        "rank 0 bytes sent per step: expert group ({} ranks, all-to-all) {:.3f} MB, expert-data "
        "group ({} ranks) {:.3f} MB",
        experts.expert->size(),
        static_cast<double>(experts.expert->stats().total_bytes_sent()) / steps / 1e6,
        experts.expert_data->size(),
        static_cast<double>(experts.expert_data->stats().total_bytes_sent()) / steps / 1e6);
  }
}

void log_memory(const parallel::ZeroOptimizer& optimizer, Device device) {
  const parallel::ModelStateBytes m = optimizer.model_state_bytes();
  const std::string device_peak =
      device.is_cuda()
          ? fmt::format("{:.1f} MB allocated on {}, ",
                        allocator_for(device).stats().peak_allocated / 1e6, device.str())
          : std::string();
  // Offload on a GPU keeps the masters and the state in host memory (Note [Offload on a GPU]).
  const std::string on_host =
      m.on_host > 0 ? fmt::format(", {:.1f} MB in host memory", m.on_host / 1e6) : std::string();
  log_info(
      "rank 0 memory: model states {:.1f} MB on {} (params {:.1f}, grads {:.1f}, optimizer "
      "{:.1f}){} and {:.1f} MB on NVMe; at the peak {}{:.1f} MB resident on the host",
      m.total() / 1e6, device.str(), m.params / 1e6, m.grads / 1e6, m.optimizer / 1e6, on_host,
      m.on_nvme / 1e6, device_peak, peak_resident_bytes() / 1e6);
}

void StepTimes::add(const parallel::StepStats& stats) {
  forward_s_ += stats.forward_s;
  backward_s_ += stats.backward_s;
  step_s_ += stats.step_s;
  ++steps_;
}

std::string StepTimes::report() {
  const double ms = 1e3 / static_cast<double>(std::max<int64_t>(steps_, 1));
  char line[128];
  std::snprintf(line, sizeof(line), "time (ms) | fwd: %.2f | bwd: %.2f | step: %.2f",
                forward_s_ * ms, backward_s_ * ms, step_s_ * ms);
  *this = StepTimes();
  return line;
}

CheckpointProfile::CheckpointProfile(std::shared_ptr<parallel::CheckpointTimes> times)
    : times_(std::move(times)) {}

std::string CheckpointProfile::report() {
  const double per_step = 1.0 / static_cast<double>(std::max<int64_t>(steps_, 1));
  char line[160];
  std::snprintf(line, sizeof(line),
                "activation checkpoints per step | segments: %.1f | forward ms: %.2f | "
                "recompute and backward ms: %.2f",
                static_cast<double>(times_->segments) * per_step,
                times_->forward_s * 1e3 * per_step, times_->backward_s * 1e3 * per_step);
  *times_ = parallel::CheckpointTimes();
  steps_ = 0;
  return line;
}

}  // namespace tessera::train
