// ZeroOptimizer's step in host memory for a run that offloads its optimizer (Note [Offload
// on a GPU] in zero_optimizer.h): the gradients' host copies, the pinned masters, and the
// step that overlaps the copies with the host's updates.
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "parallel/zero/zero_optimizer.h"

namespace tessera::parallel {

const Tensor& ZeroOptimizer::host_gradient(int64_t block) {
  const Tensor& host = host_grads_[static_cast<size_t>(block)];
  // Pinned memory, kept from step to step (pinning is slow), or memory that goes back to
  // the system when the update lets it go.
  if (host.storage().nbytes() == 0) {
    host.storage().reallocate(host.nbytes(),
                              pinned_ ? cuda::pinned_host_allocator() : mapped_host_allocator());
  }
  return host;
}

void ZeroOptimizer::prepare_gradient(int64_t block) {
  gradients_->prepare_chunk(block);
  if (host_steps_) host_gradient(block).copy_(gradients_->own_chunk(block));  // device to host
}

void ZeroOptimizer::release_host_gradient(int64_t block) {
  if (host_steps_ && !pinned_) host_grads_[static_cast<size_t>(block)].storage().release();
}

void ZeroOptimizer::pin_host_masters() {
  std::set<const void*> moved;  // storages (stage 3's chunks share one)
  for (int64_t b = 0; b < static_cast<int64_t>(layout_.blocks.size()); ++b) {
    const Storage& s = weights_->own_chunk(b).storage();
    if (!moved.insert(s.data()).second) continue;
    const Storage values = s.take_memory();  // kept until copied into the pinned memory
    s.reallocate(values.nbytes(), cuda::pinned_host_allocator());
    std::memcpy(s.data(), values.data(), values.nbytes());
  }
}

void ZeroOptimizer::host_step() {
  const int64_t blocks = static_cast<int64_t>(layout_.blocks.size());
  if (!pinned_ || !inner_->supports_parts()) {  // one copy after another
    for (int64_t b = 0; b < blocks; ++b) prepare_gradient(b);
    inner_->step();
    for (int64_t b = 0; b < blocks; ++b) {
      weights_->round_chunk(b, Tensor());
      release_host_gradient(b);
    }
    return;
  }
  // Pinned copies are queued on the device and travel while the host updates the sub-group
  // before them (the gradients) or after them (the rounded parameters) (Note [A step in parts] in
  // optim/optimizer.h: the same bits).
  if (host_groups_.empty()) {  // the sub-groups and their chunks' names, made once
    host_groups_ = sub_group_blocks(layout_, config_.sub_group_size);
    for (const std::vector<int64_t>& group : host_groups_) {
      std::set<std::string>& names = host_group_names_.emplace_back();
      for (const int64_t b : group) names.insert(chunk_name(b));
    }
  }
  const std::vector<std::vector<int64_t>>& groups = host_groups_;
  cuda::Event arrived(device_.index);
  const auto fetch = [&](size_t g) {
    for (const int64_t b : groups[g]) {
      gradients_->prepare_chunk(b);
      const Tensor& host = host_gradient(b);
      const Tensor device = gradients_->own_chunk(b);
      TS_INTERNAL_ASSERT(
          device.is_contiguous() && device.dtype() == DType::f32 && device.numel() == host.numel(),
          "a block's gradient chunk is contiguous f32");
      cuda::memcpy_to_pinned_async(host.raw_data(), device.raw_data(), host.nbytes(),
                                   device_.index);
    }
    arrived.record();
  };
  fetch(0);
  for (size_t g = 0; g < groups.size(); ++g) {
    arrived.synchronize();  // sub-group g's gradients are on the host
    if (g + 1 < groups.size()) fetch(g + 1);
    const std::set<std::string>& names = host_group_names_[g];
    inner_->update_part([&](const NamedParameter& p) { return names.count(p.name) > 0; });
    // The 16-bit values travel through the gradients' pinned copies, read by now, while
    // the host updates the next sub-group; the next step's copies into them queue after.
    // Until then the master chunks' grad() hold those 16-bit bytes: nothing reads the
    // masters' gradients between steps.
    for (const int64_t b : groups[g]) weights_->round_chunk(b, host_gradient(b));
  }
  inner_->finish_step();
}

}  // namespace tessera::parallel
