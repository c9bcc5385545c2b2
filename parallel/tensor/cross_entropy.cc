#include "parallel/tensor/cross_entropy.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "autograd/record.h"
#include "core/error.h"
#include "core/factories.h"
#include "core/grad_mode.h"
#include "kernels/elementwise.h"
#include "kernels/index.h"
#include "kernels/reduce.h"

namespace tessera::parallel {
namespace {

using kernels::BinaryOp;

Tensor unsqueeze_last(const Tensor& t) { return t.unsqueeze(-1); }  // (N) -> (N, 1)

}  // namespace

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t vocab,
                                    Communicator& group, int64_t ignore_index) {
  TS_CHECK(logits.dim() == 2 && targets.dim() == 1 && logits.size(0) == targets.size(0),
           "[vocab_parallel_cross_entropy] expected logits (N, Vl) and targets (N), found ",
           shape_str(logits.shape()), " and ", shape_str(targets.shape()));
  TS_CHECK(is_floating(logits.dtype()),
           "[vocab_parallel_cross_entropy] expected floating logits, found ",
           dtype_name(logits.dtype()));
  const int64_t n = logits.size(0), width = logits.size(1);
  const int64_t first = group.rank() * width;  // this rank's first global column
  TS_CHECK(vocab >= 1 && vocab <= width * group.size(), "[vocab_parallel_cross_entropy] vocab ",
           vocab, " does not fit ", group.size(), " slices of ", width, " columns");
  // Columns [0, real) of this slice are real vocabulary; the rest is padding.
  const int64_t real = std::clamp<int64_t>(vocab - first, 0, width);
  const Device device = logits.device();
  const TensorOptions f32{DType::f32, device};

  // Targets on the host: which rows count and where each row's target sits in this slice.
  const std::vector<int64_t> t = targets.to(Device::cpu()).to_vector<int64_t>();
  std::vector<float> counted(n, 0.0f);
  std::vector<int64_t> local_rows, local_flat;  // rows whose target this rank holds
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] == ignore_index) continue;
    TS_CHECK(t[i] >= 0 && t[i] < vocab, "[vocab_parallel_cross_entropy] target ", t[i], " of row ",
             i, " is outside [0, ", vocab, ")");
    counted[i] = 1.0f;
    ++count;
    if (t[i] >= first && t[i] < first + real) {
      local_rows.push_back(i);
      local_flat.push_back(i * real + (t[i] - first));
    }
  }
  const Tensor row_mask = from_vector(counted, {n}).to(device);  // (N) 1 for counted rows
  const Tensor rows_idx =
      from_vector(local_rows, {static_cast<int64_t>(local_rows.size())}).to(device);
  const Tensor flat_idx =
      from_vector(local_flat, {static_cast<int64_t>(local_flat.size())}).to(device);

  double inv_count = 0.0;
  Tensor e, sum_exp, loss;  // computed without recording; one node records the whole op
  {
    NoGradGuard no_grad;
    const Tensor x = logits.detach().narrow(1, 0, real).to(DType::f32).contiguous();  // (N, real)
    // Global row max over the real columns of every rank.
    Tensor row_max = real > 0 ? kernels::max(x, 1, false).values
                              : full({n}, -std::numeric_limits<double>::infinity(), f32);
    row_max = row_max.contiguous();
    group.all_reduce(row_max, ReduceOp::max);
    e = kernels::unary(kernels::UnaryOp::exp,
                       kernels::binary(BinaryOp::sub, x, unsqueeze_last(row_max)));  // (N, real)
    sum_exp = real > 0 ? kernels::sum(e, {1}, false).contiguous() : zeros({n}, f32);
    group.all_reduce(sum_exp);
    // The target logit: rows whose target this rank holds pick it, the others add 0.
    Tensor target_logit = zeros({n}, f32);
    if (!local_rows.empty()) {
      const Tensor picked = kernels::index_select(x.view({n * real}), 0, flat_idx);
      kernels::index_add_(target_logit, 0, rows_idx, picked);
    }
    group.all_reduce(target_logit);
    // loss_i = log(sum_i) + max_i - logit_i over the counted rows, averaged.
    const Tensor per_row = kernels::binary(
        BinaryOp::sub,
        kernels::binary(BinaryOp::add, kernels::unary(kernels::UnaryOp::log, sum_exp), row_max),
        target_logit);
    inv_count = count > 0 ? 1.0 / static_cast<double>(count) : 0.0;
    loss = kernels::sum(kernels::binary(BinaryOp::mul, per_row, row_mask), {0}, false);
    loss = kernels::binary(BinaryOp::mul, loss, scalar_tensor(inv_count, f32)).to(logits.dtype());
  }
  record_function("vocab_parallel_cross_entropy", {logits}, {&loss},
                  [e, sum_exp, row_mask, rows_idx, flat_idx, n, width, real, inv_count,
                   dtype = logits.dtype()](const TensorList& g) {
                    // d logits = (softmax - one_hot) * g / count on counted rows; 0 on padding.
                    const Tensor scale = kernels::binary(
                        BinaryOp::mul, row_mask,
                        kernels::binary(BinaryOp::mul, g[0].to(DType::f32),
                                        scalar_tensor(inv_count, {DType::f32, e.device()})));
                    Tensor d =
                        kernels::binary(BinaryOp::div, e, unsqueeze_last(sum_exp));  // (N, real)
                    if (rows_idx.numel() > 0) {
                      const Tensor flat = d.contiguous().view({n * real});
                      kernels::index_add_(flat, 0, flat_idx,
                                          full({flat_idx.numel()}, -1.0, {DType::f32, e.device()}));
                      d = flat.view({n, real});
                    }
                    d = kernels::binary(BinaryOp::mul, d, unsqueeze_last(scale));
                    Tensor out = zeros({n, width}, {DType::f32, e.device()});
                    if (real > 0) out.narrow(1, 0, real).copy_(d);
                    return TensorList{out.to(dtype)};
                  });
  return loss;
}

}  // namespace tessera::parallel
