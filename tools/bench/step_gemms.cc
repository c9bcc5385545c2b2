#include "tools/bench/step_gemms.h"

#include <chrono>
#include <utility>

#include "core/factories.h"
#include "kernels/matmul.h"

namespace tessera::bench {

StepGemms::StepGemms(const GptConfig& c, int64_t rows, DType dtype) : dtype_(dtype) {
  const int64_t C = c.n_embd, L = c.n_layer, V = c.padded_vocab_size(), R = rows;
  for (const auto& [out, in] :
       std::vector<std::pair<int64_t, int64_t>>{{3 * C, C}, {C, C}, {4 * C, C}, {C, 4 * C}}) {
    add(0, L, {R, in}, {out, in}, false, true);    // y = x W^T
    add(2, L, {R, out}, {out, in}, false, false);  // dx = g W
    add(3, L, {R, out}, {R, in}, true, false);     // dW = g^T x
  }
  add(1, 1, {R, C}, {V, C}, false, true);   // logits = h wte^T
  add(4, 1, {R, V}, {V, C}, false, false);  // dh = g wte
  add(4, 1, {R, C}, {R, V}, true, false);   // dwte^T = h^T g
  run();                                    // first touch of the outputs
}

void StepGemms::add(int group, int64_t count, const Shape& a, const Shape& b, bool ta, bool tb) {
  const int64_t m = ta ? a[1] : a[0], k = ta ? a[0] : a[1], n = tb ? b[0] : b[1];
  gemms_.push_back({group, count, randn(a, gen_).to(dtype_), randn(b, gen_).to(dtype_), ta, tb});
  flops_[group] += 2.0 * static_cast<double>(m * n * k * count);
  calls_[group] += count;
}

std::array<double, StepGemms::kGroups> StepGemms::run() const {
  std::array<double, kGroups> seconds{};
  for (const Gemm& g : gemms_) {
    const auto t0 = std::chrono::steady_clock::now();
    kernels::matmul(g.a, g.b, g.ta, g.tb);
    seconds[g.group] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() *
        static_cast<double>(g.count);
  }
  return seconds;
}

}  // namespace tessera::bench
