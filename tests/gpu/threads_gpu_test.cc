// Two host threads driving one GPU at once get the same bits as one thread: every kernel
// family and a whole GPT forward and backward, repeated from each thread while the other
// runs. Their work shares the device's one compute stream (Note [One compute stream]), so
// a difference is a host-side race: shared state, or memory reused while still in use.
#include <catch2/catch.hpp>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "autograd/engine.h"
#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "core/philox.h"
#include "kernels/attention.h"
#include "kernels/blas1.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/layer_norm.h"
#include "kernels/matmul.h"
#include "models/gpt2/gpt.h"
#include "tests/tiny_gpt.h"

namespace tessera {
namespace {

const Device kGpu = Device::cuda(0);

std::vector<float> host_floats(const Tensor& t) {
  return t.to(Device::cpu()).to(DType::f32).contiguous().to_vector<float>();
}

// Results of `f` (which runs on the GPU and reads its results back) from one thread, then
// 20 times from each of two threads at once: all must equal the first.
void check_threads_agree(const std::function<std::vector<float>()>& f) {
  const std::vector<float> want = f();
  std::vector<std::string> problems(2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int i = 0; i < 20; ++i) {
          if (f() != want) {
            problems[static_cast<size_t>(t)] = "differs at iteration " + std::to_string(i);
            return;
          }
        }
      } catch (const std::exception& e) {
        problems[static_cast<size_t>(t)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(problems[0] == "");
  CHECK(problems[1] == "");
}

Tensor random_gpu(const Shape& shape, uint64_t seed, DType dtype = DType::f32) {
  Generator g(seed);
  return randn(shape, g).to(dtype).to(kGpu);
}

TEST_CASE("matmuls from two threads equal one thread's", "[gpu][threads]") {
  REQUIRE(cuda::device_count() > 0);
  for (const DType dt : {DType::f32, DType::bf16}) {
    CAPTURE(dtype_name(dt));
    const Tensor a = random_gpu({256, 384}, 1, dt), b = random_gpu({512, 384}, 2, dt);
    const Tensor bias = random_gpu({512}, 3, dt);
    // A weight-gradient shape (64 x 64 outputs, K = 16384), where cuBLASLt splits K and
    // passes partial sums through its workspace between kernels (Note [cuBLASLt per
    // thread], kernels/cuda/matmul.cu).
    const Tensor dy = random_gpu({16384, 64}, 14, dt), x = random_gpu({16384, 64}, 15, dt);
    check_threads_agree([&] {
      std::vector<float> out = host_floats(kernels::linear(a, b, bias));
      for (const Tensor& t : {kernels::matmul(b, a, false, true), kernels::matmul(dy, x, true)}) {
        const std::vector<float> v = host_floats(t);
        out.insert(out.end(), v.begin(), v.end());
      }
      return out;
    });
  }
}

TEST_CASE("row kernels from two threads equal one thread's", "[gpu][threads]") {
  REQUIRE(cuda::device_count() > 0);
  const Tensor x = random_gpu({64, 768}, 4), w = random_gpu({768}, 5), b = random_gpu({768}, 6);
  const Tensor dy = random_gpu({64, 768}, 7);
  const Tensor targets = from_vector<int64_t>(std::vector<int64_t>(64, 3)).to(kGpu);
  check_threads_agree([&] {
    const kernels::LayerNormOutput ln = kernels::layer_norm(x, w, b, 1e-5);
    const kernels::LayerNormGrads g = kernels::layer_norm_backward(dy, x, w, ln.mean, ln.rstd);
    const kernels::CrossEntropyOutput ce = kernels::cross_entropy(x, targets);
    const Tensor dloss = ones({}, {DType::f32, kGpu});
    const Tensor dx = kernels::cross_entropy_backward(dloss, x, targets, ce.lse);
    std::vector<float> out = host_floats(ln.y);
    for (const Tensor& t : {g.dx, g.dweight, g.dbias, ce.loss, dx}) {
      const std::vector<float> v = host_floats(t);
      out.insert(out.end(), v.begin(), v.end());
    }
    out.push_back(static_cast<float>(kernels::squared_norm(x)));
    return out;
  });
}

TEST_CASE("attention and embeddings from two threads equal one thread's", "[gpu][threads]") {
  REQUIRE(cuda::device_count() > 0);
  const Tensor q = random_gpu({2, 3, 65, 64}, 8, DType::bf16);
  const Tensor k = random_gpu({2, 3, 65, 64}, 9, DType::bf16);
  const Tensor v = random_gpu({2, 3, 65, 64}, 10, DType::bf16);
  const Tensor dout = random_gpu({2, 3, 65, 64}, 11, DType::bf16);
  const Tensor weight = random_gpu({50, 32}, 12);
  const Tensor grad = random_gpu({4, 40, 32}, 13);
  std::vector<int64_t> id_values;
  for (int i = 0; i < 160; ++i) id_values.push_back((i * 7) % 50);
  const Tensor ids = from_vector(id_values, {4, 40}).to(kGpu);
  check_threads_agree([&] {
    const kernels::AttentionOutput o = kernels::causal_attention(q, k, v, 0.125);
    const kernels::AttentionGrads g =
        kernels::causal_attention_backward(dout, q, k, v, o.out, o.lse, 0.125);
    std::vector<float> out;
    for (const Tensor& t : {o.out, o.lse, g.dq, g.dk, g.dv, kernels::embedding(weight, ids),
                            kernels::embedding_backward(grad, ids, 50)}) {
      const std::vector<float> vals = host_floats(t);
      out.insert(out.end(), vals.begin(), vals.end());
    }
    return out;
  });
}

TEST_CASE("GPT forward and backward from two threads equal one thread's", "[gpu][threads]") {
  REQUIRE(cuda::device_count() > 0);
  const GptConfig c = testing::one_layer_gpt_config();
  std::vector<int32_t> ids;
  for (int i = 0; i < 42; ++i) ids.push_back((i * 5) % 23);
  const Tensor rows = from_vector(ids, {6, 7});
  check_threads_agree([&] {
    Gpt model(c, 99);
    model.to(kGpu, DType::f32);
    const Tensor r = rows.to(kGpu);
    const Tensor x = r.narrow(1, 0, 6).contiguous(), y = r.narrow(1, 1, 6).contiguous();
    const Tensor loss = model.loss(model.forward(x), y);
    backward(loss);
    std::vector<float> out = host_floats(loss);
    for (const Tensor& p : model.parameters()) {
      const std::vector<float> g = host_floats(p.grad());
      out.insert(out.end(), g.begin(), g.end());
    }
    return out;
  });
}

}  // namespace
}  // namespace tessera
