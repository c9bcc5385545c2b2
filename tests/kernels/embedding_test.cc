// Embedding gather and scatter-add against naive loops.
#include "kernels/embedding.h"

#include <catch2/catch.hpp>
#include <vector>

#include "core/factories.h"
#include "kernels/elementwise.h"

using namespace tessera;
using namespace tessera::kernels;

TEST_CASE("embedding gathers weight rows by id", "[embedding]") {
  Generator gen(31);
  const int64_t vocab = 11;
  const int64_t channels = 7;
  const std::vector<Tensor> weights = {
      randn({vocab, channels}, gen),
      randn({channels, vocab}, gen, {DType::f64}).transpose(0, 1),  // non-contiguous
  };
  const std::vector<int64_t> ids = {3, 0, 10, 3, 7, 1};
  for (const Tensor& w : weights) {
    for (DType id_dtype : {DType::i32, DType::i64}) {
      INFO(dtype_name(w.dtype()) << " ids " << dtype_name(id_dtype));
      const Tensor out = embedding(w, from_vector<int64_t>(ids, {2, 3}).to(id_dtype));
      REQUIRE(out.shape() == Shape{2, 3, channels});
      REQUIRE(out.dtype() == w.dtype());
      const std::vector<double> wv = w.to_vector<double>();
      const std::vector<double> ov = out.to_vector<double>();
      for (size_t n = 0; n < ids.size(); ++n) {
        for (int64_t c = 0; c < channels; ++c) {
          REQUIRE(ov[n * channels + c] == wv[ids[n] * channels + c]);
        }
      }
    }
  }
  // Transposed ids and 0-dim ids.
  const Tensor w = weights[0];
  const Tensor ids_t = from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3}).transpose(0, 1);
  const std::vector<double> ot = embedding(w, ids_t).to_vector<double>();
  const std::vector<double> wv = w.to_vector<double>();
  CHECK(ot[1 * channels] == wv[4 * channels]);  // out[0, 1] is id 4
  const Tensor one = embedding(w, scalar_tensor(9, {DType::i64}));
  REQUIRE(one.shape() == Shape{channels});
  CHECK(one.to_vector<double>()[2] == wv[9 * channels + 2]);
}

TEST_CASE("embedding_backward sums gradient rows per id", "[embedding]") {
  Generator gen(32);
  for (DType dtype : {DType::f32, DType::f64}) {
    for (int64_t channels : {1, 5, 150}) {
      INFO(dtype_name(dtype) << " C " << channels);
      const int64_t vocab = 9;
      const std::vector<int64_t> ids = {8, 2, 2, 0, 5, 2, 8, 1, 2, 2, 0, 8};
      const Tensor id = from_vector<int64_t>(ids, {3, 4});
      // A transposed gradient of logical shape (3, 4, C).
      const Tensor grad = randn({channels, 4, 3}, gen, {dtype}).permute({2, 1, 0});
      const Tensor dw = embedding_backward(grad, id.to(DType::i32), vocab);
      REQUIRE(dw.shape() == Shape{vocab, channels});
      REQUIRE(dw.dtype() == dtype);
      const std::vector<double> gv = grad.to_vector<double>();
      std::vector<double> want(static_cast<size_t>(vocab * channels), 0.0);
      for (size_t n = 0; n < ids.size(); ++n) {
        for (int64_t c = 0; c < channels; ++c) want[ids[n] * channels + c] += gv[n * channels + c];
      }
      const std::vector<double> got = dw.to_vector<double>();
      const double tol = dtype == DType::f32 ? 1e-5 : 1e-12;
      for (size_t i = 0; i < got.size(); ++i) {
        if (std::abs(got[i] - want[i]) > tol * (1 + std::abs(want[i]))) {
          INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
          REQUIRE(false);
        }
      }
    }
  }
}

TEST_CASE("embedding_backward with a large vocabulary splits it across tasks", "[embedding]") {
  Generator gen(33);
  const int64_t vocab = 3001;
  const int64_t channels = 64;
  const std::vector<int64_t> ids = rand({5000}, gen, {DType::f64}, 0.0, static_cast<double>(vocab))
                                       .to(DType::i64)
                                       .to_vector<int64_t>();
  const Tensor grad = randn({5000, channels}, gen, {DType::f64});
  const std::vector<double> got =
      embedding_backward(grad, from_vector<int64_t>(ids), vocab).to_vector<double>();
  const std::vector<double> gv = grad.to_vector<double>();
  std::vector<double> want(static_cast<size_t>(vocab * channels), 0.0);
  for (size_t n = 0; n < ids.size(); ++n) {
    for (int64_t c = 0; c < channels; ++c) want[ids[n] * channels + c] += gv[n * channels + c];
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::abs(got[i] - want[i]) > 1e-12 * (1 + std::abs(want[i]))) {
      INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
      REQUIRE(false);
    }
  }
}

TEST_CASE("embedding_backward_add_ adds the rows in place, bitwise as the dense sum",
          "[embedding]") {
  // Note [Gradients added in place]: the tied wte's gradient takes the lookup's rows
  // without a dense (V, C) tensor; the result must be bitwise dweight + embedding_backward.
  Generator gen(34);
  for (DType dtype : {DType::f32, DType::f64}) {
    for (int64_t channels : {1, 37, 768}) {
      INFO(dtype_name(dtype) << " C " << channels);
      const int64_t vocab = 11;
      const Tensor id = from_vector<int64_t>({3, 9, 3, 0, 3, 10, 9, 3}, {2, 4});
      const Tensor grad = randn({channels, 4, 2}, gen, {dtype}).permute({2, 1, 0});  // (2, 4, C)
      const Tensor base = randn({vocab, channels}, gen, {dtype});
      const Tensor want = binary(BinaryOp::add, base, embedding_backward(grad, id, vocab));
      const Tensor dw = base.clone();
      embedding_backward_add_(dw, grad, id.to(DType::i32));
      CHECK(dw.to_vector<double>() == want.to_vector<double>());
      // Rows no id names keep their values exactly.
      CHECK(dw.narrow(0, 4, 5).to_vector<double>() == base.narrow(0, 4, 5).to_vector<double>());
    }
  }
  // Many ids across tasks, with repeats.
  const Tensor ids = rand({6000}, gen, {DType::f64}, 0.0, 700.0).to(DType::i64);
  const Tensor grad = randn({6000, 48}, gen);
  const Tensor base = randn({700, 48}, gen);
  const Tensor dw = base.clone();
  embedding_backward_add_(dw, grad, ids);
  CHECK(dw.to_vector<double>() ==
        binary(BinaryOp::add, base, embedding_backward(grad, ids, 700)).to_vector<double>());
}

TEST_CASE("embedding errors name the id and its position", "[embedding]") {
  const Tensor w = zeros({5, 3});
  REQUIRE_THROWS_WITH(embedding(w, from_vector<int64_t>({0, 4, 1, 5}, {2, 2})),
                      Catch::Contains("[embedding]") && Catch::Contains("[0, 5)") &&
                          Catch::Contains("found 5 at flat position 3") &&
                          Catch::Contains("(2, 2)"));
  REQUIRE_THROWS_WITH(embedding(w, from_vector<int32_t>({-2})),
                      Catch::Contains("[embedding]") && Catch::Contains("found -2"));
  REQUIRE_THROWS_WITH(embedding(w, zeros({2})),
                      Catch::Contains("[embedding]") && Catch::Contains("f32"));
  REQUIRE_THROWS_WITH(embedding(zeros({5}), from_vector<int64_t>({0})),
                      Catch::Contains("[embedding]") && Catch::Contains("(5)"));
  REQUIRE_THROWS_WITH(embedding_backward(zeros({2, 3}), from_vector<int64_t>({0, 9}), 5),
                      Catch::Contains("[embedding_backward]") && Catch::Contains("found 9"));
  REQUIRE_THROWS_WITH(embedding_backward(zeros({2, 3}), from_vector<int64_t>({0, 1, 2}), 5),
                      Catch::Contains("[embedding_backward]") && Catch::Contains("(2, 3)") &&
                          Catch::Contains("(3)"));
  REQUIRE_THROWS_WITH(
      embedding_backward(zeros({2, 3}, {DType::i32}), from_vector<int64_t>({0, 1}), 5),
      Catch::Contains("[embedding_backward]") && Catch::Contains("i32"));
  Tensor dw = zeros({5, 3});
  REQUIRE_THROWS_WITH(embedding_backward_add_(dw, zeros({2, 3}), from_vector<int64_t>({4, 5})),
                      Catch::Contains("[embedding_backward_add_]") && Catch::Contains("[0, 5)") &&
                          Catch::Contains("found 5 at flat position 1"));
  REQUIRE_THROWS_WITH(embedding_backward_add_(dw, zeros({2, 4}), from_vector<int64_t>({0, 1})),
                      Catch::Contains("[embedding_backward_add_]") && Catch::Contains("(V, 4)") &&
                          Catch::Contains("(5, 3)"));
  Tensor dw_t = zeros({3, 5}).transpose(0, 1);
  REQUIRE_THROWS_WITH(
      embedding_backward_add_(dw_t, zeros({2, 3}), from_vector<int64_t>({0, 1})),
      Catch::Contains("[embedding_backward_add_]") && Catch::Contains("contiguous"));
  CHECK(dw.to_vector<double>() == std::vector<double>(15, 0.0));  // untouched by the refusals
}
