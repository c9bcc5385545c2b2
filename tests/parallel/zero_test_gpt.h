// The GPT, optimizer and token rows the ZeRO equivalence tests train on
// (tests/parallel/zero_optimizer_test.cc in f32, mixed_zero_test.cc in 16 bits).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/factories.h"
#include "models/gpt2/gpt.h"
#include "optim/config.h"

namespace tessera::testing {

// 18475 parameters (25 x 739), which none of 2, 3 and 4 divides, at block size `t`.
// Without biases: the loss does not depend on the key bias (it shifts every score of a
// query equally), so its exact gradient is 0 and the computed one is rounding noise, which
// Adam normalizes into full-size steps. Any change of summation order (which data
// parallelism must make) changes that noise, so the key bias of two correct runs differs
// at the scale of the learning rate.
inline GptConfig zero_test_gpt(int64_t t) {
  GptConfig c;
  c.vocab_size = 37;
  c.block_size = t;
  c.n_layer = 2;
  c.n_head = 5;
  c.n_embd = 25;
  c.bias = false;
  return c;
}

inline optim::OptimizerConfig zero_test_adamw() {
  optim::OptimizerConfig o;
  o.lr = 1e-3;
  o.weight_decay = 0.1;
  return o;
}

// `rows` token rows of t + 1 ids below 37, the same for every run: (rows, t + 1).
inline Tensor zero_test_rows(int64_t rows, int64_t t) {
  Generator gen(7);
  const Tensor u = rand({rows, t + 1}, gen, {DType::f64});
  std::vector<int32_t> ids;
  for (double v : u.to_vector<double>()) ids.push_back(static_cast<int32_t>(v * 37));
  return from_vector(ids, {rows, t + 1});
}

// Rows [first, first + n) of zero_test_rows() as (inputs, targets), each (n, t).
inline std::pair<Tensor, Tensor> zero_test_batch(const Tensor& rows, int64_t first, int64_t n) {
  const Tensor r = rows.narrow(0, first, n);
  const int64_t t = r.size(1) - 1;
  return {r.narrow(1, 0, t).contiguous(), r.narrow(1, 1, t).contiguous()};
}

// Backward of one step's micro-batches on rank `rank` of `world`, whose micro-batch m is
// rows [step * global_rows + (m * world + rank) * micro, + micro) of zero_test_rows(), with
// micro = global_rows / gas / world, moved to the model's device; each loss is scaled by
// 1 / gas, the last reduces. `Optimizer` is a ZeroOptimizer. Returns this rank's mean loss
// over the micro-batches.
template <class Optimizer>
double zero_test_backward(Optimizer& opt, Gpt& model, const Tensor& rows, int step,
                          int64_t global_rows, int64_t gas, int world, int rank) {
  const int64_t micro = global_rows / gas / world;
  const Device device = model.parameters().front().device();
  double loss = 0;
  for (int64_t m = 0; m < gas; ++m) {
    const auto [x, y] =
        zero_test_batch(rows, step * global_rows + (m * world + rank) * micro, micro);
    const Tensor l = model.loss(model.forward(x.to(device)), y.to(device));
    loss += l.item<double>() / static_cast<double>(gas);
    opt.backward(l, 1.0 / static_cast<double>(gas), m == gas - 1);
  }
  return loss;
}

// The model's parameters and opt's f32 masters (whole_parameters(): collective), each flat
// in the model's parameter order, as f32. Stage 3's model parameters are partitioned: no
// model values then (`with_model` false).
struct FlatValues {
  std::vector<float> model, masters;
};
template <class Optimizer>
FlatValues zero_test_values(Optimizer& opt, const Gpt& model, bool with_model) {
  FlatValues out;
  opt.wait_for_parameters();  // the last step's gathers (Note [Gathers after the step])
  if (with_model) {
    for (const Tensor& p : model.parameters()) {
      for (float v : p.detach().to_vector<float>()) out.model.push_back(v);
    }
  }
  const StateDict whole = opt.whole_parameters();
  const std::map<std::string, Tensor> by_name(whole.begin(), whole.end());
  for (const NamedParameter& p : model.named_parameters()) {
    for (float v : by_name.at(p.name).to_vector<float>()) out.masters.push_back(v);
  }
  return out;
}

}  // namespace tessera::testing
