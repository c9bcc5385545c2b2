#include "parallel/zero/zero_offload.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "parallel/zero/zero_state.h"

namespace tessera::parallel {
namespace {

// Each rank's swap file of `kind`, unique among the live optimizers of every process on the
// host, gone from the directory at once: the open file lives until the swapper closes it,
// and a process that dies leaves nothing behind.
std::unique_ptr<TensorSwapper> make_swap_file(const std::string& dir, const char* kind,
                                              const ZeroConfig& config, const Communicator& dp,
                                              const void* owner, int64_t buffer_count,
                                              int64_t buffer_bytes) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  TS_CHECK(!error, "[offload] cannot create the swap directory ", dir, ": ", error.message());
  char object[32];
  std::snprintf(object, sizeof(object), "%p", owner);
  auto swapper = std::make_unique<TensorSwapper>(
      str_cat(dir, "/tessera_", kind, "_", ::getpid(), "_", dp.rank(), "_", object, ".swp"),
      config.aio, static_cast<int>(buffer_count), buffer_bytes);
  std::error_code ignored;
  std::filesystem::remove(swapper->path(), ignored);
  return swapper;
}

}  // namespace

std::unique_ptr<TensorSwapper> make_offload_swapper(const ZeroConfig& config,
                                                    const Communicator& dp, const void* owner) {
  // Staging buffers that keep one context's queue full.
  return make_swap_file(config.offload_optimizer.nvme_path, "optimizer", config, dp, owner,
                        config.offload_optimizer.buffer_count,
                        config.aio.block_size * config.aio.queue_depth);
}

std::unique_ptr<TensorSwapper> make_param_swapper(const ZeroConfig& config, const Communicator& dp,
                                                  const void* owner) {
  // DeepSpeed's buffers hold buffer_size 16-bit elements each.
  return make_swap_file(config.offload_param.nvme_path, "params", config, dp, owner,
                        config.offload_param.buffer_count, 2 * config.offload_param.buffer_size);
}

std::vector<std::vector<int64_t>> sub_group_blocks(const FlatLayout& layout,
                                                   int64_t sub_group_size) {
  std::vector<std::vector<int64_t>> groups;
  int64_t numel = 0;
  for (size_t b = 0; b < layout.blocks.size(); ++b) {
    if (groups.empty() || numel >= sub_group_size) {  // DeepSpeed's rule
      groups.emplace_back();
      numel = 0;
    }
    groups.back().push_back(static_cast<int64_t>(b));
    numel += layout.blocks[b].chunk;
  }
  return groups;
}

ZeroOffload::ZeroOffload(const ZeroConfig& config, const FlatLayout& layout,
                         optim::Optimizer& inner, TensorSwapper& swapper,
                         const std::vector<int64_t>& master_ids,
                         const std::vector<int64_t>& gradient_ids)
    : blocks_(sub_group_blocks(layout, config.sub_group_size)),
      master_ids_(master_ids),
      swapper_(swapper) {
  std::vector<SwappedOptimizerState::SubGroup> groups(blocks_.size());
  for (size_t g = 0; g < blocks_.size(); ++g) {
    for (const int64_t block : blocks_[g]) {
      const auto b = static_cast<size_t>(block);
      groups[g].params.push_back(chunk_name(block));
      if (!master_ids.empty()) groups[g].storages.push_back(master_ids[b]);
      if (!gradient_ids.empty()) groups[g].gradients.push_back(gradient_ids[b]);
    }
  }
  state_ = std::make_unique<SwappedOptimizerState>(
      inner, std::move(groups), swapper_,
      SwapPipelining{config.offload_optimizer.pipeline_read,
                     config.offload_optimizer.pipeline_write});
}

void ZeroOffload::load(const StateDict& chunk_state,
                       const std::function<void(int64_t block)>& fill_block,
                       const std::function<void(int64_t block)>& after_block) {
  std::function<void(size_t)> fill;
  if (fill_block) {
    fill = [&](size_t g) {
      for (const int64_t b : blocks_[g]) fill_block(b);
    };
  }
  state_->load(chunk_state, fill, [&](size_t g) {
    for (const int64_t b : blocks_[g]) after_block(b);
  });
}

void ZeroOffload::step(const std::function<void(int64_t block)>& before_block,
                       const std::function<void(int64_t block)>& after_block) {
  state_->step(
      [&](size_t g) {
        for (const int64_t b : blocks_[g]) before_block(b);
      },
      [&](size_t g) {
        for (const int64_t b : blocks_[g]) after_block(b);
      });
}

}  // namespace tessera::parallel
