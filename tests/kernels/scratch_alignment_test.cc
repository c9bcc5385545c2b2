// The 16-bit CPU kernels give the same bits wherever their f32 scratch lands (Note [Aligned
// scratch] in kernels/cpu/widen.h): a run must not depend on the stack depth. Before the
// scratch was aligned, a bf16 training run's loss changed with the length of its config
// file's path.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/factories.h"
#include "core/philox.h"
#include "kernels/blas1.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"

namespace tessera {
namespace {

// The bytes of what the kernels under test return for x (bf16, 64 x 65, one chunk of
// each kernel's loop: parallel_for runs it inline on this thread).
std::vector<uint8_t> kernel_bits(const Tensor& x, const Tensor& targets) {
  std::vector<uint8_t> out;
  const auto append = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  };
  const auto append_tensor = [&](const Tensor& t) {
    append(t.raw_data(), static_cast<size_t>(t.numel()) * itemsize(t.dtype()));
  };
  const double norm = kernels::squared_norm(x);
  append(&norm, sizeof(norm));
  const Tensor y = kernels::unary(kernels::UnaryOp::tanh, x);
  kernels::axpy_(y, x, 0.37);
  kernels::scale_(y, 1.3);
  append_tensor(y);
  append_tensor(kernels::unary(kernels::UnaryOp::exp, x));
  append_tensor(kernels::unary(kernels::UnaryOp::gelu, x));
  const kernels::CrossEntropyOutput ce = kernels::cross_entropy(x, targets);
  append_tensor(ce.loss);
  append_tensor(ce.lse);
  append_tensor(kernels::cross_entropy_backward(ce.loss, x, targets, ce.lse));
  return out;
}

// f() with the stack pointer moved down by 16 * (units + 1) bytes: the callee's stack
// buffers land at another offset modulo a cache line for each units in 0..3.
template <class F>
[[gnu::noinline]] auto at_stack_offset(int units, const F& f) {
  volatile char* pad = static_cast<volatile char*>(__builtin_alloca(16 * units + 1));
  pad[0] = 0;
  return f();
}

TEST_CASE("16-bit kernels give the same bits wherever their stack scratch lies") {
  Generator gen(5);
  const Tensor x = randn({64, 65}, gen, {DType::f32}, 0.0, 3.0).to(DType::bf16);
  std::vector<int64_t> t(64);
  for (int64_t i = 0; i < 64; ++i) t[i] = (i * 7) % 65;
  const Tensor targets = from_vector(t, {64});
  const std::vector<uint8_t> want = kernel_bits(x, targets);
  for (int units = 0; units < 4; ++units) {
    INFO("stack moved by " << 16 * (units + 1) << " bytes");
    CHECK(at_stack_offset(units, [&] { return kernel_bits(x, targets); }) == want);
  }
}

}  // namespace
}  // namespace tessera
