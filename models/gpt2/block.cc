#include "models/gpt2/block.h"

#include "autograd/ops.h"
#include "core/error.h"
#include "models/moe/expert_mlp.h"

namespace tessera {
namespace {

// A sub-layer's output divided by progressive layer drop's divisor (DeepSpeed divides by
// keep_prob; 1: none).
Tensor scaled(const Tensor& y, double divisor) { return divisor == 1.0 ? y : y / divisor; }

}  // namespace

Block::Block(const GptConfig& cfg, int64_t layer, parallel::DropoutStreams& streams,
             parallel::Communicator& model_group, parallel::AsyncCollectives* async,
             parallel::Communicator* expert_group)
    : ln_1_(cfg.n_embd, cfg.layer_norm_eps, cfg.bias),
      attn_(cfg, streams, model_group, async),
      ln_2_(cfg.n_embd, cfg.layer_norm_eps, cfg.bias) {
  register_module("ln_1", ln_1_);
  register_module("attn", attn_);
  register_module("ln_2", ln_2_);
  if (cfg.moe && cfg.moe->is_moe_block(layer)) {
    TS_CHECK(model_group.size() == 1, "[gpt2] moe: experts are not split over a tensor-parallel ",
             "group (DeepSpeed's enable_expert_tensor_parallelism is not supported by Tessera); "
             "expected tensor_parallel.tp_size 1, found ",
             model_group.size());
    const int64_t c = cfg.n_embd;
    const bool bias = cfg.bias;
    moe_ = std::make_unique<moe::MoeLayer>(
        c, cfg.moe->experts_at(layer), cfg.moe->gate, cfg.moe->use_residual,
        [c, bias](int64_t) { return std::make_unique<moe::ExpertMlp>(c, 4 * c, bias); },
        streams.replicated(), DType::f32, expert_group);
    register_module("mlp", *moe_);
  } else {
    mlp_ = std::make_unique<Mlp>(cfg, streams.replicated(), model_group, async);
    register_module("mlp", *mlp_);
  }
}

Tensor Block::feed_forward(const Tensor& h, std::vector<moe::MoeOutput>* moe_out) const {
  if (mlp_) return mlp_->forward(h);
  moe::MoeOutput out = moe_->forward(h);
  const Tensor y = std::move(out.output);
  if (moe_out) moe_out->push_back(std::move(out));
  return y;
}

Tensor Block::forward(const Tensor& x, std::vector<moe::MoeOutput>* moe_out, double divisor) const {
  const ModuleScope scope(*this);  // Note [Forward observers]
  const Tensor a = scaled(attn_.forward(ln_1_(x)), divisor);
  if (takes_fused_ops(x)) {
    // The residual add and ln_2 in one pass each way (Note [Residual layer norm] in
    // kernels/cuda/layer_norm.cu).
    const auto [h, y] = ln_2_.add_forward(x, a);
    return h + scaled(feed_forward(y, moe_out), divisor);
  }
  const Tensor h = x + a;
  return h + scaled(feed_forward(ln_2_(h), moe_out), divisor);
}

parallel::PendingSum Block::start_sublayer(int sublayer, const Tensor& x) const {
  TS_CHECK(mlp_ != nullptr, "[gpt2] a batch-split forward needs dense blocks; found an MoE block");
  const ModuleScope scope(*this);
  return sublayer == 0 ? attn_.start(ln_1_(x)) : mlp_->start(ln_2_(x));
}

Tensor Block::finish_sublayer(int sublayer, const Tensor& x, const parallel::PendingSum& pending,
                              double divisor) const {
  const ModuleScope scope(*this);
  return x + scaled(sublayer == 0 ? attn_.finish(pending) : mlp_->finish(pending), divisor);
}

Tensor Block::forward_cached(const Tensor& x, Tensor& cache_k, Tensor& cache_v,
                             int64_t start) const {
  const Tensor h = x + attn_.forward_cached(ln_1_(x), cache_k, cache_v, start);
  return h + feed_forward(ln_2_(h), nullptr);
}

}  // namespace tessera
