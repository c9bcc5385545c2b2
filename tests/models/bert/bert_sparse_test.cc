// BERT with block-sparse attention: a dense layout reproduces the dense model, sparse
// layouts run and restrict what each position sees, unidirectional layouts are refused.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "models/bert/bert.h"
#include "models/bert/masking.h"
#include "models/sparse/sparsity_config.h"
#include "tests/models/bert/tiny_bert.h"
#include "tests/testing.h"

namespace tessera {
namespace {

using testing::error_of;

BertConfig tiny() { return testing::tiny_bert(16); }

SparsityConfig dense_layout() {
  SparsityConfig s;
  s.mode = SparsityMode::dense;
  s.block = 4;
  return s;
}

// Sparse Transformer "fixed", bidirectional: windows of 2 blocks, 1 global block each.
SparsityConfig fixed_layout() {
  SparsityConfig s;
  s.mode = SparsityMode::fixed;
  s.block = 4;
  s.num_local_blocks = 2;
  s.num_global_blocks = 1;
  s.unidirectional = false;
  return s;
}

Tensor some_ids(int64_t b, int64_t t, int64_t vocab) {
  std::vector<int64_t> v(static_cast<size_t>(b * t));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>((i * 13 + 5) % vocab);
  return from_vector(v, {b, t});
}

struct Run {
  std::vector<double> logits;
  double loss = 0.0;
  std::map<std::string, std::vector<double>> grads;
};

// Forward, loss and backward of a fresh model (seed 17) in `dtype`.
Run run(const BertConfig& cfg, const SparsityConfig* sparse, DType dtype, const MaskedBatch& b) {
  Bert model(cfg, 17, sparse);
  model.to(Device::cpu(), dtype);
  const Tensor logits = model.forward(b.inputs);
  const Tensor loss = model.loss(logits, b.targets);
  backward(loss);
  Run r;
  r.logits = logits.to_vector<double>();
  r.loss = loss.item<double>();
  for (const NamedParameter& p : model.named_parameters()) {
    REQUIRE(p.tensor.grad().defined());
    r.grads[p.name] = p.tensor.grad().to_vector<double>();
  }
  return r;
}

TEST_CASE("BERT refuses a unidirectional sparsity layout") {
  SparsityConfig s = fixed_layout();
  s.unidirectional = true;
  CHECK(error_of([&] { Bert model(tiny(), 1, &s); }) ==
        "[bert] sparse_attention.attention: BERT is bidirectional; expected \"bidirectional\", "
        "found \"unidirectional\"");
}

TEST_CASE("a dense sparsity layout gives the dense model's logits and gradients") {
  const BertConfig cfg = tiny();
  const SparsityConfig s = dense_layout();
  // T = 10 is not a multiple of the block: the sparse path pads to 12 and masks.
  const MaskedBatch b = mask_tokens(some_ids(2, 10, cfg.vocab_size), cfg, 3, 0);
  for (const DType dtype : {DType::f64, DType::f32}) {
    INFO("dtype " << dtype_name(dtype));
    const double tol = dtype == DType::f64 ? 1e-10 : 1e-5;
    const Run dense = run(cfg, nullptr, dtype, b);
    const Run sparse = run(cfg, &s, dtype, b);
    CHECK(sparse.loss == Approx(dense.loss).epsilon(tol));
    CHECK(testing::max_abs_diff(sparse.logits, dense.logits) <= tol);
    for (const auto& [name, g] : dense.grads) {
      INFO(name);
      CHECK(testing::max_abs_diff(sparse.grads.at(name), g) <= tol);
    }
  }
}

TEST_CASE("BERT with a fixed bidirectional layout trains and differs from dense") {
  const BertConfig cfg = tiny();
  const SparsityConfig s = fixed_layout();
  const MaskedBatch b = mask_tokens(some_ids(2, 16, cfg.vocab_size), cfg, 5, 0);
  const Run dense = run(cfg, nullptr, DType::f32, b);
  const Run sparse = run(cfg, &s, DType::f32, b);
  CHECK(std::isfinite(sparse.loss));
  CHECK(testing::max_abs_diff(sparse.logits, dense.logits) > 1e-6);
  for (const auto& [name, g] : sparse.grads) {
    INFO(name);
    for (double x : g) REQUIRE(std::isfinite(x));
  }
  // Checkpointed layers give the same gradients through the sparse path.
  Bert model(cfg, 17, &s);
  model.set_activation_checkpointing(1);
  backward(model.loss(model.forward(b.inputs), b.targets));
  for (const NamedParameter& p : model.named_parameters()) {
    INFO(p.name);
    CHECK(p.tensor.grad().to_vector<double>() == sparse.grads.at(p.name));
  }
}

TEST_CASE("one sparse layer: a position's logits ignore exactly the keys its layout hides") {
  BertConfig cfg = tiny();
  cfg.n_layer = 1;  // one attention hop: what position 0 sees is the layout's row
  const SparsityConfig s = fixed_layout();
  Bert model(cfg, 23, &s);
  model.eval();
  NoGradGuard no_grad;
  const SparseSelfAttention* attn = model.layer(0).self_attention().sparse();
  REQUIRE(attn != nullptr);
  auto seen_by_0 = [&](int64_t key) {
    for (int64_t h = 0; h < cfg.n_head; ++h) {
      if (attn->visible(h, 0, key)) return true;
    }
    return false;
  };
  std::vector<int64_t> ids = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3};
  const Tensor base = model.forward(from_vector(ids, {1, 16})).select(1, 0).contiguous();
  int hidden = 0, shown = 0;
  for (int64_t key = 1; key < 16; ++key) {
    std::vector<int64_t> changed = ids;
    changed[static_cast<size_t>(key)] = 30;
    const Tensor y = model.forward(from_vector(changed, {1, 16})).select(1, 0).contiguous();
    const double d = testing::max_abs_diff(y.to_vector<double>(), base.to_vector<double>());
    INFO("key " << key);
    if (seen_by_0(key)) {
      ++shown;
      CHECK(d > 1e-6);
    } else {
      ++hidden;
      CHECK(d == 0.0);
    }
  }
  CHECK(hidden > 0);  // the layout is sparse for position 0
  CHECK(shown > 0);
}

TEST_CASE("every layer shares one random layout, a function of the seed") {
  BertConfig cfg = tiny();
  cfg.block_size = 64;
  SparsityConfig s;
  s.mode = SparsityMode::bigbird;
  s.block = 4;
  s.num_random_blocks = 2;
  s.num_sliding_window_blocks = 3;
  s.num_global_blocks = 1;
  Bert a(cfg, 1, &s), b(cfg, 1, &s), c(cfg, 2, &s);
  auto layout = [](const Bert& m, size_t i) {
    return m.layer(i).self_attention().sparse()->layout().to_vector<int64_t>();
  };
  CHECK(layout(a, 0) == layout(a, 1));
  CHECK(layout(a, 0) == layout(b, 0));
  CHECK(layout(a, 1) == layout(b, 1));
  CHECK(layout(a, 0) != layout(c, 0));
}

}  // namespace
}  // namespace tessera
