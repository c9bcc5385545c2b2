// DeepSpeed's activation_checkpointing options (parallel/engine/checkpoint_policy.h) on a
// tensor-parallel GPT of 2 thread ranks that recomputes every block: partitioned and host
// kept inputs give the loss and every gradient bit for bit as plain recomputation does,
// partitioning all-gathers each kept block input over the tensor-parallel group in
// backward, and profile times every segment.
#include "parallel/engine/checkpoint_policy.h"

#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "core/factories.h"
#include "core/philox.h"
#include "models/gpt2/gpt.h"
#include "parallel/comm/thread_comm.h"

namespace tessera {
namespace {

constexpr int kLayers = 3;

GptConfig config() {
  GptConfig c;
  c.vocab_size = 61;
  c.block_size = 9;
  c.n_layer = kLayers;
  c.n_head = 4;
  c.n_embd = 16;
  c.dropout = 0.1;  // the recomputation must redraw the same masks
  return c;
}

struct Outcome {
  float loss = 0;
  std::map<std::string, std::vector<float>> grads;
  int64_t gathered_bytes = 0;  // the tensor-parallel group's all-gather bytes in backward
  std::shared_ptr<parallel::CheckpointTimes> times;
};

// Rank `tp.rank()`'s forward and backward of one batch with every block recomputed.
Outcome run(parallel::Communicator& tp, const parallel::ActivationCheckpointingConfig& ac) {
  Gpt model(config(), 7, &tp);
  model.train();
  Outcome o;
  o.times = std::make_shared<parallel::CheckpointTimes>();
  model.set_activation_checkpointing(
      1, parallel::make_checkpoint_policy(ac, &tp, Device::cpu(), o.times));
  std::vector<int64_t> x(2 * 9), y(2 * 9);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = philox4x32(i, 1, 2)[0] % 61;
    y[i] = philox4x32(i, 1, 3)[0] % 61;
  }
  const Tensor loss = model.loss(model.forward(from_vector(x, {2, 9})), from_vector(y, {2, 9}));
  o.loss = loss.item<float>();
  const int64_t before = tp.stats()[parallel::CommOp::all_gather].bytes_sent;
  backward(loss);
  o.gathered_bytes = tp.stats()[parallel::CommOp::all_gather].bytes_sent - before;
  for (const NamedParameter& p : model.named_parameters()) {
    o.grads[p.name] = p.tensor.grad().to_vector<float>();
  }
  return o;
}

std::vector<Outcome> run_ranks(const parallel::ActivationCheckpointingConfig& ac) {
  std::vector<Outcome> out(2);
  std::mutex mutex;
  parallel::run_thread_ranks(2, [&](parallel::Communicator& tp) {
    Outcome o = run(tp, ac);
    std::lock_guard<std::mutex> lock(mutex);
    out[tp.rank()] = std::move(o);
  });
  return out;
}

TEST_CASE("partitioned and host-kept checkpoint inputs give the same bits", "[checkpoint]") {
  const std::vector<Outcome> plain = run_ranks({});
  parallel::ActivationCheckpointingConfig partitioned;
  partitioned.partition_activations = true;
  parallel::ActivationCheckpointingConfig everything = partitioned;
  everything.cpu_checkpointing = true;
  everything.synchronize_checkpoint_boundary = true;
  everything.profile = true;
  for (const auto& ac : {partitioned, everything}) {
    const std::vector<Outcome> got = run_ranks(ac);
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r << (ac.profile ? ", every option" : ", partitioned"));
      CHECK(got[r].loss == plain[r].loss);
      CHECK(got[r].grads == plain[r].grads);
      // Each block's kept input (2 x 9 x 16 f32) is all-gathered from halves: each rank sends
      // its half once per block.
      CHECK(got[r].gathered_bytes - plain[r].gathered_bytes == kLayers * 2 * 9 * 16 * 4 / 2);
    }
  }
  const std::vector<Outcome> profiled = run_ranks(everything);
  CHECK(profiled[0].times->segments == kLayers);
  CHECK(profiled[0].times->forward_s > 0);
  CHECK(profiled[0].times->backward_s > 0);
  CHECK(plain[0].times->segments == 0);  // no profile asked for
}

}  // namespace
}  // namespace tessera
