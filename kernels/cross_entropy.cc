// Validation and the device switch of the fused softmax cross-entropy.
#include "kernels/cross_entropy.h"

#include <algorithm>

#include "core/dispatch.h"
#include "core/factories.h"
#include "kernels/checks.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels {
namespace {

// logits: (N, V) floating; targets: (N) i32|i64 on logits' device.
void check_inputs(const char* op, const Tensor& logits, const Tensor& targets) {
  check_defined(op, "logits", logits);
  check_defined(op, "targets", targets);
  check_floating(op, "logits", logits);
  dispatch_index(targets.dtype(), op, [](auto) {});
  check_same_device(op, "logits", logits, "targets", targets);
  TS_CHECK(logits.dim() == 2, "[", op, "] expected logits of shape (N, V), found ",
           shape_str(logits.shape()));
  TS_CHECK(logits.size(1) > 0, "[", op, "] expected logits with at least one class, found ",
           shape_str(logits.shape()));
  check_shape(op, "targets", targets, {logits.size(0)});
}

}  // namespace

CrossEntropyOutput cross_entropy(const Tensor& logits, const Tensor& targets,
                                 int64_t ignore_index) {
  check_inputs("cross_entropy", logits, targets);
  if (logits.device().is_cuda()) return cuda::cross_entropy(logits, targets, ignore_index);
  return cpu::cross_entropy(logits, targets, ignore_index);
}

Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                              const Tensor& lse, int64_t ignore_index, int64_t padded_cols) {
  constexpr const char* op = "cross_entropy_backward";
  check_inputs(op, logits, targets);
  check_defined(op, "dloss", dloss);
  check_defined(op, "lse", lse);
  check_stat_dtype(op, "logits", logits, "dloss", dloss);
  check_stat_dtype(op, "logits", logits, "lse", lse);
  check_same_device(op, "logits", logits, "dloss", dloss);
  check_same_device(op, "logits", logits, "lse", lse);
  TS_CHECK(dloss.numel() == 1, "[cross_entropy_backward] expected a one-element dloss, found ",
           shape_str(dloss.shape()));
  check_shape(op, "lse", lse, {logits.size(0)});
  const int64_t vocab = logits.size(1);
  const int64_t cols = std::max(vocab, padded_cols);
  if (logits.device().is_cuda()) {
    return cuda::cross_entropy_backward(dloss, logits, targets, lse, ignore_index, cols);
  }
  return cpu::cross_entropy_backward(dloss, logits, targets, lse, ignore_index, cols);
}

}  // namespace tessera::kernels
