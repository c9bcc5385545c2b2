// CPU vs CUDA parity of the gather/scatter kernels: embedding (+backward with repeated
// ids), cat, index_select and index_add_ (duplicate indices), and run-to-run determinism of
// the scatter-adds. Gathers and joins copy values, so they must match exactly.
#include <catch2/catch.hpp>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "kernels/embedding.h"
#include "kernels/index.h"
#include "tests/gpu/parity.h"
#include "tests/testing.h"

namespace tessera {
namespace {

using testing::both;
using testing::check_bitwise;
using testing::check_close;
using testing::Input;
using testing::kCuda;
using testing::random;
using testing::random_in;
using testing::random_t;
using testing::tol_for;

// An index tensor of `dtype` (i32 or i64) on both sides.
Input index_of(const std::vector<int64_t>& values, const Shape& shape, DType dtype) {
  const Tensor host = from_vector(values, shape).to(dtype);
  return {host, host.to(kCuda)};
}

// `count` ids in [0, high): many repeats when count >> high.
std::vector<int64_t> random_ids(int64_t count, int64_t high, uint64_t seed) {
  Generator g(seed);
  return rand({count}, g, {DType::f32}, 0.0, static_cast<double>(high))
      .to(DType::i64)
      .to_vector<int64_t>();
}

TEST_CASE("embedding and its backward match the CPU with repeated ids", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const int64_t V = 50, C = 67;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (DType id_dtype : {DType::i64, DType::i32}) {
      DYNAMIC_SECTION(dtype_name(dt) << " weight, " << dtype_name(id_dtype) << " ids") {
        // Ids in [0, 10) of 50 rows: every used row repeats, rows 10.. get no gradient.
        const Input ids = index_of(random_ids(4 * 33, 10, 90), {4, 33}, id_dtype);  // (4, 33)
        for (bool transposed : {false, true}) {
          INFO((transposed ? "non-contiguous weight" : "contiguous weight"));
          const Input w = random_in({V, C}, 91, dt, transposed);  // (V, C)
          check_close(kernels::embedding(w.dev, ids.dev), kernels::embedding(w.ref, ids.ref), dt,
                      0.0);
        }
        const Input grad = random({4, 33, C}, 92, dt);  // (4, 33, C)
        const Tensor dw = kernels::embedding_backward(grad.dev, ids.dev, V);
        check_close(dw, kernels::embedding_backward(grad.ref, ids.ref, V), dt, tol_for(dt, 1e-5));
        const std::vector<double> unused = dw.narrow(0, 10, V - 10).to_vector<double>();
        CHECK(unused == std::vector<double>(unused.size(), 0.0));
        // 0-dim ids pick one row; no ids give a zero gradient.
        const Input one = index_of({7}, {}, id_dtype);
        const Input w = random({V, C}, 93, dt);
        check_close(kernels::embedding(w.dev, one.dev), kernels::embedding(w.ref, one.ref), dt,
                    0.0);
        const Input none = index_of({}, {0}, id_dtype);
        const Input g0 = random({0, C}, 94, dt);
        check_close(kernels::embedding_backward(g0.dev, none.dev, V),
                    kernels::embedding_backward(g0.ref, none.ref, V), dt, 0.0);
      }
    }
  }
}

TEST_CASE("embedding_backward_add_ adds rows in place like the CPU, other rows untouched",
          "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  const int64_t V = 50, C = 67;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (DType id_dtype : {DType::i64, DType::i32}) {
      DYNAMIC_SECTION(dtype_name(dt) << " weight, " << dtype_name(id_dtype) << " ids") {
        const Input ids = index_of(random_ids(4 * 33, 10, 95), {4, 33}, id_dtype);  // (4, 33)
        const Input grad = random({4, 33, C}, 96, dt);                              // (4, 33, C)
        const Input base = random({V, C}, 97, dt);                                  // (V, C)
        const Tensor dw = base.dev.clone();
        kernels::embedding_backward_add_(dw, grad.dev, ids.dev);
        const Tensor want = base.ref.clone();
        kernels::embedding_backward_add_(want, grad.ref, ids.ref);
        check_close(dw, want, dt, tol_for(dt, 1e-5));
        // Rows 10.. get no id: bitwise what they were.
        check_bitwise(dw.narrow(0, 10, V - 10), base.dev.narrow(0, 10, V - 10));
      }
    }
  }
}

TEST_CASE("cat matches the CPU along every dim, with strided and empty pieces", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::i64}) {
    DYNAMIC_SECTION("cat " << dtype_name(dt)) {
      for (int64_t dim : {0, 1, 2, -1}) {
        INFO("dim " << dim);
        const int64_t d = dim < 0 ? dim + 3 : dim;
        // Four pieces of (3, 5, 7) with sizes 5, 2, 0, 4 along `dim`; the second is strided.
        std::vector<Tensor> refs, devs;
        int64_t seed = 100;
        for (int64_t n : {5, 2, 0, 4}) {
          Shape shape{3, 5, 7};
          shape[d] = n;
          const bool strided = n == 2 && d != 2;  // last two dims swapped in memory
          const Input piece = random_in(shape, static_cast<uint64_t>(seed++), dt, strided);
          refs.push_back(piece.ref);
          devs.push_back(piece.dev);
        }
        check_close(kernels::cat(devs, dim), kernels::cat(refs, dim), dt, 0.0);
      }
      const Input single = random_t({4, 6}, 110, dt);
      check_close(kernels::cat({single.dev}, 0), kernels::cat({single.ref}, 0), dt, 0.0);
    }
  }
}

TEST_CASE("index_select matches the CPU with repeated indices", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  struct Case {
    int64_t dim;
    std::vector<int64_t> index;
  };
  const Case cases[] = {{1, {6, 0, 6, 3, 6}}, {0, {4, 4, 0}}, {-1, {8, 1}}, {1, {}}};
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::i64}) {
    for (DType id_dtype : {DType::i64, DType::i32}) {
      DYNAMIC_SECTION(dtype_name(dt) << " x, " << dtype_name(id_dtype) << " index") {
        for (bool transposed : {false, true}) {
          const Input x = random_in({5, 7, 9}, 120, dt, transposed);  // (5, 7, 9)
          for (const Case& c : cases) {
            INFO("dim " << c.dim << ", " << c.index.size() << " indices"
                        << (transposed ? ", non-contiguous x" : ""));
            const Input index =
                index_of(c.index, {static_cast<int64_t>(c.index.size())}, id_dtype);  // (L)
            check_close(kernels::index_select(x.dev, c.dim, index.dev),
                        kernels::index_select(x.ref, c.dim, index.ref), dt, 0.0);
          }
        }
      }
    }
  }
}

TEST_CASE("index_add_ matches the CPU with duplicate indices", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  struct Case {
    int64_t dim;
    std::vector<int64_t> index;
  };
  const Case cases[] = {{1, {2, 5, 2, 2, 0}}, {0, {4, 4, 1}}, {2, {8, 0, 8, 8}}, {1, {}}};
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (DType id_dtype : {DType::i64, DType::i32}) {
      DYNAMIC_SECTION(dtype_name(dt) << " out, " << dtype_name(id_dtype) << " index") {
        for (bool transposed : {false, true}) {
          for (const Case& c : cases) {
            INFO("dim " << c.dim << ", " << c.index.size() << " indices"
                        << (transposed ? ", non-contiguous out and src" : ""));
            const int64_t L = static_cast<int64_t>(c.index.size());
            Shape src_shape{5, 7, 9};
            src_shape[c.dim] = L;
            const Input out = random_in({5, 7, 9}, 130, dt, transposed);  // (5, 7, 9)
            const Input src = random_in(src_shape, 131, dt, transposed && L > 1);
            const Input index = index_of(c.index, {L}, id_dtype);  // (L)
            kernels::index_add_(out.ref, c.dim, index.ref, src.ref);
            kernels::index_add_(out.dev, c.dim, index.dev, src.dev);
            check_close(out.dev, out.ref, dt, tol_for(dt, 1e-5));
          }
        }
      }
    }
  }
}

TEST_CASE("embedding_backward and index_add_ give bitwise equal results run to run", "[gpu]") {
  REQUIRE(cuda::device_count() > 0);
  for (DType dt : {DType::f32, DType::bf16}) {
    DYNAMIC_SECTION("determinism " << dtype_name(dt)) {
      // 8192 positions into 16 rows: heavy contention on every row.
      const Tensor ids = from_vector(random_ids(8192, 16, 140)).to(kCuda);  // (8192)
      const Input grad = random({8192, 256}, 141, dt);                      // (8192, 256)
      check_bitwise(kernels::embedding_backward(grad.dev, ids, 16),
                    kernels::embedding_backward(grad.dev, ids, 16));

      const Input src = random({16, 8192, 64}, 142, dt);  // (16, 8192, 64)
      Tensor a = zeros({16, 16, 64}, {dt, kCuda}), b = zeros({16, 16, 64}, {dt, kCuda});
      kernels::index_add_(a, 1, ids, src.dev);
      kernels::index_add_(b, 1, ids, src.dev);
      check_bitwise(a, b);
    }
  }
}

TEST_CASE("a bad id or index fails the next device read with the CPU's message, not the call",
          "[gpu]") {
  const Input weight = random({5, 3}, 60, DType::f32);
  const Input rows = random({4, 3}, 61, DType::f32);
  for (const DType idt : {DType::i32, DType::i64}) {
    CAPTURE(dtype_name(idt));
    // Flat positions 2 and 4 are out of range; 2 is the first.
    const Input ids = index_of({0, 4, 5, 1, -1, 3}, {2, 3}, idt);
    const Input index = index_of({1, 0, 9, 2}, {4}, idt);
    const std::string embedding_error =
        testing::error_of([&] { kernels::embedding(weight.ref, ids.ref); });
    CHECK_THAT(embedding_error, Catch::Contains("found 5 at flat position 2 of ids (2, 3)"));
    const Tensor gathered = kernels::embedding(weight.dev, ids.dev);  // returns at once
    CHECK_THROWS_WITH(gathered.to(Device::cpu()), embedding_error);

    const Input grads = random({2, 3, 3}, 62, DType::f32);
    kernels::embedding_backward(grads.dev, ids.dev, 5);
    CHECK_THROWS_WITH(cuda::synchronize(0), Catch::Contains("[embedding_backward] expected ids "
                                                            "in [0, 5), found 5"));

    const std::string select_error =
        testing::error_of([&] { kernels::index_select(rows.ref, 0, index.ref); });
    kernels::index_select(rows.dev, 0, index.dev);
    CHECK_THROWS_WITH(cuda::synchronize(0), select_error);

    const Tensor target = zeros({4, 3}, {DType::f32, kCuda});
    const std::string add_error = testing::error_of([&] {
      kernels::index_add_(zeros({4, 3}, {DType::f64}), 0, index.ref, rows.ref);
    });
    kernels::index_add_(target, 0, index.dev, rows.dev);
    CHECK_THROWS_WITH(target.to(Device::cpu()), add_error);
  }
  // Nothing is left pending, and the device computes on.
  cuda::synchronize(0);
  const Input ids = index_of({4, 0, 2}, {3}, DType::i64);
  check_bitwise(kernels::embedding(weight.dev, ids.dev),
                kernels::embedding(weight.ref, ids.ref).to(DType::f32).to(kCuda));
}

}  // namespace
}  // namespace tessera
