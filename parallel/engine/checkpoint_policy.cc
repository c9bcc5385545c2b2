#include "parallel/engine/checkpoint_policy.h"

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factories.h"
#include "parallel/comm/flat_pieces.h"

namespace tessera::parallel {
namespace {

// Keeps this rank's piece of t's flat values on `keep_on` (a copy, so that t's storage is
// freed); gives back the whole of t on t's device by an all-gather over `slices`.
std::function<Tensor()> keep_piece(const Tensor& t, Communicator& slices, Device keep_on) {
  const Tensor piece = flat_piece(t, slices);
  const Tensor mine = keep_on == t.device() ? piece.clone() : piece.to(keep_on);
  const Shape shape = t.shape();
  const Device device = t.device();
  Communicator* group = &slices;
  return
      [mine, shape, device, group] { return gather_flat_pieces(mine.to(device), shape, *group); };
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
