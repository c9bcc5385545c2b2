#include "parallel/engine/checkpoint_policy.h"

#include <algorithm>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factories.h"

namespace tessera::parallel {
namespace {

// Keeps this rank's piece of t's flat values (a copy, so that t's storage is freed) on
// `keep_on`; gives back the whole of t on t's device by an all-gather over `slices`.
std::function<Tensor()> keep_piece(const Tensor& t, Communicator& slices, Device keep_on) {
  const int parts = slices.size();
  const int64_t n = t.numel(), piece = (n + parts - 1) / parts;
  const int64_t begin = std::min(n, piece * slices.rank());
  const int64_t len = std::min(n, begin + piece) - begin;
  Tensor mine = zeros({piece}, {t.dtype(), t.device()});
  if (len > 0) mine.narrow(0, 0, len).copy_(t.contiguous().view({n}).narrow(0, begin, len));
  mine = mine.to(keep_on);
  const Shape shape = t.shape();
  const Device device = t.device();
  Communicator* group = &slices;
  return [mine, shape, device, n, piece, parts, group] {
    const Tensor all = empty({piece * parts}, {mine.dtype(), device});
    group->all_gather(mine.to(device), all);
    return all.narrow(0, 0, n).view(shape);
  };
}

}  // namespace

CheckpointPolicy make_checkpoint_policy(const ActivationCheckpointingConfig& config,
                                        Communicator* slices, Device device,
                                        std::shared_ptr<CheckpointTimes> times) {
  CheckpointPolicy policy;
  const bool split = config.partition_activations && slices != nullptr && slices->size() > 1;
  const bool to_host = config.cpu_checkpointing && device.is_cuda();
  if (split) {
    policy.keep = [slices, to_host](const Tensor& t) {
      return keep_piece(t, *slices, to_host ? Device::cpu() : t.device());
    };
  } else if (to_host) {
    policy.keep = [](const Tensor& t) {
      const Tensor host = t.to(Device::cpu());
      const Device back = t.device();
      return std::function<Tensor()>([host, back] { return host.to(back); });
    };
  }
  // Timing queued device work needs the device synchronized too.
  if ((config.synchronize_checkpoint_boundary || config.profile) && device.is_cuda()) {
    policy.at_boundary = [index = device.index] { cuda::synchronize(index); };
  }
  if (config.profile) {
    TS_INTERNAL_ASSERT(times != nullptr,
                       "activation_checkpointing.profile needs a CheckpointTimes");
    policy.timed = [times](bool backward, double seconds) {
      if (backward) {
        times->backward_s += seconds;
      } else {
        times->forward_s += seconds;
        ++times->segments;
      }
    };
  }
  return policy;
}

}  // namespace tessera::parallel
