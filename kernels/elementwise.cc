// Validation and the device switch of the elementwise family.
#include "kernels/elementwise.h"

#include <string>

#include "kernels/checks.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels {
namespace {

// Which forward tensor op' is computed from (see unary_backward).
enum class Saved : uint8_t { none, input, output };

Saved saved_for_backward(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg:
      return Saved::none;
    case UnaryOp::log:
    case UnaryOp::relu:
    case UnaryOp::gelu:
      return Saved::input;
    case UnaryOp::exp:
    case UnaryOp::sqrt:
    case UnaryOp::rsqrt:
    case UnaryOp::tanh:
    case UnaryOp::sigmoid:
      return Saved::output;
  }
  TS_INTERNAL_ASSERT(false, "unknown unary op ", static_cast<int>(op));
}

// A defined `t` must match grad's shape, dtype and device.
void check_like_grad(const char* op, const char* name, const Tensor& t, const Tensor& grad) {
  if (!t.defined()) return;
  check_same_shape(op, "grad", grad, name, t);
  check_same_dtype(op, "grad", grad, name, t);
  check_same_device(op, "grad", grad, name, t);
}

// The checks binary and compare share: a and b defined, of one dtype and device, with
// shapes that broadcast.
void check_operands(const char* op, const Tensor& a, const Tensor& b) {
  check_defined(op, "a", a);
  check_defined(op, "b", b);
  check_same_dtype(op, "a", a, "b", b);
  check_same_device(op, "a", a, "b", b);
  broadcast_shapes(a.shape(), b.shape(), op);
}

}  // namespace

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg:
      return "neg";
    case UnaryOp::exp:
      return "exp";
    case UnaryOp::log:
      return "log";
    case UnaryOp::sqrt:
      return "sqrt";
    case UnaryOp::rsqrt:
      return "rsqrt";
    case UnaryOp::tanh:
      return "tanh";
    case UnaryOp::relu:
      return "relu";
    case UnaryOp::gelu:
      return "gelu";
    case UnaryOp::sigmoid:
      return "sigmoid";
  }
  TS_INTERNAL_ASSERT(false, "unknown unary op ", static_cast<int>(op));
}

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add:
      return "add";
    case BinaryOp::sub:
      return "sub";
    case BinaryOp::mul:
      return "mul";
    case BinaryOp::div:
      return "div";
    case BinaryOp::pow:
      return "pow";
    case BinaryOp::maximum:
      return "maximum";
    case BinaryOp::minimum:
      return "minimum";
  }
  TS_INTERNAL_ASSERT(false, "unknown binary op ", static_cast<int>(op));
}

const char* compare_name(CompareOp op) {
  switch (op) {
    case CompareOp::eq:
      return "eq";
    case CompareOp::ne:
      return "ne";
    case CompareOp::lt:
      return "lt";
    case CompareOp::le:
      return "le";
    case CompareOp::gt:
      return "gt";
    case CompareOp::ge:
      return "ge";
  }
  TS_INTERNAL_ASSERT(false, "unknown compare op ", static_cast<int>(op));
}

Tensor unary(UnaryOp op, const Tensor& x) {  // (*) -> (*)
  check_defined(unary_name(op), "x", x);
  check_floating(unary_name(op), "x", x);
  if (x.device().is_cuda()) return cuda::unary(op, x);
  return cpu::unary(op, x);
}

// Only the forward tensor that op' reads must be defined: y for exp, sqrt, rsqrt, tanh and
// sigmoid, x for log, relu and gelu, neither for neg.
Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x,
                      const Tensor& y) {  // (*), (*), (*) -> (*)
  const std::string name = std::string(unary_name(op)) + "_backward";
  check_defined(name.c_str(), "grad", grad);
  check_floating(name.c_str(), "grad", grad);
  switch (saved_for_backward(op)) {
    case Saved::none:
      break;
    case Saved::input:
      check_defined(name.c_str(), "the forward input x", x);
      break;
    case Saved::output:
      check_defined(name.c_str(), "the forward output y", y);
      break;
  }
  check_like_grad(name.c_str(), "x", x, grad);
  check_like_grad(name.c_str(), "y", y, grad);
  if (grad.device().is_cuda()) return cuda::unary_backward(op, grad, x, y);
  return cpu::unary_backward(op, grad, x, y);
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {  // (*a), (*b) -> broadcast
  check_operands(binary_name(op), a, b);
  check_floating(binary_name(op), "a", a);
  if (a.device().is_cuda()) return cuda::binary(op, a, b);
  return cpu::binary(op, a, b);
}

Tensor compare(CompareOp op, const Tensor& a, const Tensor& b) {  // (*a), (*b) -> broadcast
  check_operands(compare_name(op), a, b);
  if (a.device().is_cuda()) return cuda::compare(op, a, b);
  return cpu::compare(op, a, b);
}

Tensor where(const Tensor& cond, const Tensor& a,
             const Tensor& b) {  // (*c) bool, (*a), (*b) -> broadcast
  check_defined("where", "cond", cond);
  TS_CHECK(cond.dtype() == DType::boolean, "[where] expected cond of dtype bool, found ",
           dtype_name(cond.dtype()));
  check_operands("where", a, b);
  check_same_device("where", "cond", cond, "a", a);
  broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  if (a.device().is_cuda()) return cuda::where(cond, a, b);
  return cpu::where(cond, a, b);
}

}  // namespace tessera::kernels
