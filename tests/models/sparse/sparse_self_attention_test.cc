// SparseSelfAttention against dense attention: the dense layout equals dense attention,
// every other layout equals dense attention with the entries outside it masked to -inf
// (forward and backward), at lengths that are not multiples of the block, with DeepSpeed's
// masks; and gradcheck.
#include "models/sparse/sparse_self_attention.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "core/factories.h"
#include "tests/testing.h"

namespace tessera {
namespace {

using testing::error_of;
using testing::require_close;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Qkv {
  Tensor q, k, v, dout;  // (B, H, T, D)
};

Tensor leaf(Tensor t) {
  t.set_requires_grad(true);
  return t;
}

Qkv inputs(int64_t heads, int64_t len, int64_t dim, DType dtype, uint64_t seed) {
  Generator g(seed);
  const Shape shape{2, heads, len, dim};
  return {leaf(randn(shape, g, {dtype})), leaf(randn(shape, g, {dtype})),
          leaf(randn(shape, g, {dtype})), randn(shape, g, {dtype})};
}

struct Result {
  std::vector<double> out, dq, dk, dv;
};

// Runs `attend` forward and backward with the upstream gradient x.dout.
template <class F>
Result run(const Qkv& x, F attend) {
  for (const Tensor* t : {&x.q, &x.k, &x.v}) t->set_grad(Tensor());
  const Tensor out = attend(x.q, x.k, x.v);
  backward(out, x.dout);
  return {out.to_vector<double>(), x.q.grad().to_vector<double>(), x.k.grad().to_vector<double>(),
          x.v.grad().to_vector<double>()};
}

// Dense attention with the (B, H, T, T) scores outside `visible` at -inf (materialized).
Tensor masked_dense(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& visible) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const Tensor scores = mul(matmul(q, transpose(k, 2, 3)), scalar_like(q, scale));
  return matmul(softmax(where(visible, scores, scalar_like(scores, -kInf))), v);
}

// The element mask of `attn`'s layout at `len` positions (and causality), for batch 2.
Tensor element_mask(const SparseSelfAttention& attn, int64_t heads, int64_t len, bool causal) {
  std::vector<bool> m;
  for (int64_t n = 0; n < 2; ++n) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < len; ++i) {
        for (int64_t j = 0; j < len; ++j) m.push_back(attn.visible(h, i, j) && (!causal || j <= i));
      }
    }
  }
  return from_vector(m, {2, heads, len, len});
}

void require_same(const Result& got, const Result& want, double tol) {
  {
    INFO("output");
    require_close(from_vector(got.out), want.out, tol);
  }
  {
    INFO("dq");
    require_close(from_vector(got.dq), want.dq, tol);
  }
  {
    INFO("dk");
    require_close(from_vector(got.dk), want.dk, tol);
  }
  {
    INFO("dv");
    require_close(from_vector(got.dv), want.dv, tol);
  }
}

SparsityConfig config_of(const std::string& json) {
  return SparsityConfig::from_json(
      JsonObjectReader(nlohmann::json::parse(json), "test", "$.sparse_attention"));
}

TEST_CASE("the dense layout equals dense attention within 1e-6", "[sparse_attention]") {
  const SparsityConfig dense = config_of(R"({"mode": "dense", "block": 16})");
  const SparseSelfAttention attn(dense, 3, 128, 1);
  const Qkv x = inputs(3, 64, 32, DType::f32, 3);
  SECTION("bidirectional") {
    const Result want = run(x, [](const Tensor& q, const Tensor& k, const Tensor& v) {
      return matmul(
          softmax(mul(matmul(q, transpose(k, 2, 3)), scalar_like(q, 1 / std::sqrt(32.0)))), v);
    });
    require_same(run(x, [&](const Tensor& q, const Tensor& k,
                            const Tensor& v) { return attn.forward(q, k, v, false); }),
                 want, 1e-6);
  }
  SECTION("causal, against the flash kernel") {
    const Result want = run(x, [](const Tensor& q, const Tensor& k, const Tensor& v) {
      return causal_attention(q, k, v);
    });
    require_same(run(x, [&](const Tensor& q, const Tensor& k,
                            const Tensor& v) { return attn.forward(q, k, v, true); }),
                 want, 1e-6);
  }
}

TEST_CASE("every layout equals dense attention masked outside it", "[sparse_attention]") {
  const std::vector<std::string> configs = {
      R"({"mode": "fixed", "block": 8, "num_local_blocks": 2})",
      R"({"mode": "fixed", "block": 8, "num_local_blocks": 2, "attention": "unidirectional"})",
      R"({"mode": "fixed", "block": 8, "num_local_blocks": 4, "num_global_blocks": 1,
          "different_layout_per_head": true, "num_different_global_patterns": 2,
          "horizontal_global_attention": true})",
      R"({"mode": "variable", "block": 8, "num_random_blocks": 1, "local_window_blocks": [1, 2],
          "global_block_indices": [0, 5], "global_block_end_indices": [1, 7]})",
      R"({"mode": "bigbird", "block": 8, "num_random_blocks": 2, "different_layout_per_head": true})",
      R"({"mode": "bigbird", "block": 8, "num_random_blocks": 1, "attention": "unidirectional"})",
      R"({"mode": "bslongformer", "block": 8, "global_block_indices": [2]})",
      R"({"mode": "local_sliding_window", "block": 8, "num_sliding_window_blocks": 3})",
  };
  for (const std::string& json : configs) {
    DYNAMIC_SECTION(json) {
      const SparsityConfig cfg = config_of(json);
      const SparseSelfAttention attn(cfg, 4, 80, 5);
      const Qkv x = inputs(4, 80, 16, DType::f64, 7);
      for (const bool causal : {false, true}) {
        if (!causal && cfg.unidirectional) continue;
        INFO("causal " << causal);
        const Tensor mask = element_mask(attn, 4, 80, causal);
        const Result want = run(x, [&](const Tensor& q, const Tensor& k, const Tensor& v) {
          return masked_dense(q, k, v, mask);
        });
        require_same(run(x, [&](const Tensor& q, const Tensor& k,
                                const Tensor& v) { return attn.forward(q, k, v, causal); }),
                     want, 1e-12);
      }
    }
  }
}

TEST_CASE("a length that is not a multiple of the block is padded and unpadded",
          "[sparse_attention]") {
  const SparsityConfig cfg =
      config_of(R"({"mode": "bslongformer", "block": 8, "num_sliding_window_blocks": 3})");
  const SparseSelfAttention attn(cfg, 2, 64, 9);
  const Qkv x = inputs(2, 37, 16, DType::f64, 11);  // 37 = 4 blocks + 5
  for (const bool causal : {false, true}) {
    INFO("causal " << causal);
    const Tensor mask = element_mask(attn, 2, 37, causal);
    const Result want = run(x, [&](const Tensor& q, const Tensor& k, const Tensor& v) {
      return masked_dense(q, k, v, mask);
    });
    const Result got = run(x, [&](const Tensor& q, const Tensor& k, const Tensor& v) {
      return attn.forward(q, k, v, causal);
    });
    REQUIRE(got.out.size() == size_t{2 * 2 * 37 * 16});
    require_same(got, want, 1e-12);
  }
}

TEST_CASE("DeepSpeed's key padding and attention masks, in both modes", "[sparse_attention]") {
  const SparsityConfig cfg = config_of(R"({"mode": "fixed", "block": 8, "num_local_blocks": 2})");
  const SparseSelfAttention attn(cfg, 2, 32, 13);
  const Qkv x = inputs(2, 30, 8, DType::f64, 15);  // padded to 32 inside
  Generator g(17);
  // mul key padding: batch 1 hides its last 4 keys; add attention mask: random offsets.
  std::vector<double> kp(2 * 30, 1.0);
  for (int64_t c = 26; c < 30; ++c) kp[30 + c] = 0.0;
  const Tensor kp_mul = from_vector(kp, {2, 30});
  const Tensor am_add = randn({30, 30}, g, {DType::f64});
  std::vector<bool> m;
  for (int64_t n = 0; n < 2; ++n) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < 30; ++i) {
        for (int64_t j = 0; j < 30; ++j) m.push_back(attn.visible(h, i, j) && kp[n * 30 + j] != 0);
      }
    }
  }
  const Tensor mask = from_vector(m, {2, 2, 30, 30});
  const Result want = run(x, [&](const Tensor& q, const Tensor& k, const Tensor& v) {
    const double scale = 1.0 / std::sqrt(8.0);
    const Tensor scores = add(mul(matmul(q, transpose(k, 2, 3)), scalar_like(q, scale)), am_add);
    return matmul(softmax(where(mask, scores, scalar_like(scores, -kInf))), v);
  });
  require_same(run(x,
                   [&](const Tensor& q, const Tensor& k, const Tensor& v) {
                     return attn.forward(q, k, v, false, kp_mul, kernels::MaskMode::mul, am_add,
                                         kernels::MaskMode::add);
                   }),
               want, 1e-12);
}

TEST_CASE("sparse attention passes gradcheck", "[sparse_attention]") {
  const SparsityConfig cfg = config_of(
      R"({"mode": "bigbird", "block": 2, "num_random_blocks": 1, "num_sliding_window_blocks": 1})");
  const SparseSelfAttention attn(cfg, 2, 12, 19);
  Generator g(21);
  const TensorList in = {leaf(randn({1, 2, 11, 3}, g, {DType::f64})),
                         leaf(randn({1, 2, 11, 3}, g, {DType::f64})),
                         leaf(randn({1, 2, 11, 3}, g, {DType::f64}))};
  for (const bool causal : {false, true}) {
    const GradcheckResult r =
        gradcheck([&](const TensorList& x) { return attn.forward(x[0], x[1], x[2], causal); }, in);
    INFO(r.message);
    CHECK(r.ok);
  }
}

TEST_CASE("shorter sequences use the master layout's corner", "[sparse_attention]") {
  const SparsityConfig cfg =
      config_of(R"({"mode": "variable", "block": 4, "num_random_blocks": 2})");
  const SparseSelfAttention attn(cfg, 3, 64, 23);
  const kernels::BlockLayout& l = attn.block_layout(16, Device::cpu());
  REQUIRE(l.blocks == 4);
  const std::vector<int32_t> row_start = l.row_start.to_vector<int32_t>();
  const std::vector<int32_t> nz_col = l.nz_col.to_vector<int32_t>();
  for (int64_t h = 0; h < 3; ++h) {
    for (int64_t i = 0; i < 4; ++i) {
      std::vector<bool> on(4, false);
      for (int32_t z = row_start[h * 4 + i]; z < row_start[h * 4 + i + 1]; ++z)
        on[nz_col[z]] = true;
      for (int64_t j = 0; j < 4; ++j) CHECK(on[j] == attn.visible(h, 4 * i, 4 * j));
    }
  }
  // The same tables come back for the same length and device.
  CHECK(&attn.block_layout(16, Device::cpu()) == &l);
}

TEST_CASE("sparse attention refuses what it cannot run", "[sparse_attention]") {
  const SparseSelfAttention attn(config_of(R"({"mode": "fixed"})"), 2, 64, 1);
  const Qkv x = inputs(2, 80, 8, DType::f32, 1);
  CHECK_THAT(error_of([&] { attn.forward(x.q, x.k, x.v, false); }),
             Catch::Contains("sequence of 80 positions exceeds the layout's max_seq_len 64"));
  const Qkv y = inputs(3, 16, 8, DType::f32, 1);
  CHECK_THAT(error_of([&] { attn.forward(y.q, y.k, y.v, false); }),
             Catch::Contains("expected q of shape (B, 2, T, D)"));
}

}  // namespace
}  // namespace tessera
