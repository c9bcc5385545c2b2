#include "kernels/checks.h"

namespace tessera::kernels {

void check_defined(const char* op, const char* name, const Tensor& t) {
  TS_CHECK(t.defined(), "[", op, "] expected ", name, " to be a defined tensor, found undefined");
}

void check_floating(const char* op, const char* name, const Tensor& t) {
  const DType d = t.dtype();
  TS_CHECK(d == DType::f32 || d == DType::f64 || d == DType::f16 || d == DType::bf16, "[", op,
           "] expected ", name, " of dtype f32, f64, f16 or bf16, found ", dtype_name(d));
}

void check_same_dtype(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                      const Tensor& b) {
  TS_CHECK(a.dtype() == b.dtype(), "[", op, "] dtypes differ: ", name_a, " ", dtype_name(a.dtype()),
           " vs ", name_b, " ", dtype_name(b.dtype()));
}

DType stat_dtype(DType x) { return is_half(x) ? DType::f32 : x; }

void check_stat_dtype(const char* op, const char* name_x, const Tensor& x, const char* name,
                      const Tensor& t) {
  TS_CHECK(t.dtype() == stat_dtype(x.dtype()), "[", op, "] expected ", name, " of dtype ",
           dtype_name(stat_dtype(x.dtype())), " for ", name_x, " ", dtype_name(x.dtype()),
           ", found ", dtype_name(t.dtype()));
}

void check_same_device(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                       const Tensor& b) {
  TS_CHECK(a.device() == b.device(), "[", op, "] devices differ: ", name_a, " on ",
           a.device().str(), " vs ", name_b, " on ", b.device().str());
}

void check_same_shape(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                      const Tensor& b) {
  TS_CHECK(a.shape() == b.shape(), "[", op, "] shapes differ: ", name_a, " ", shape_str(a.shape()),
           " vs ", name_b, " ", shape_str(b.shape()));
}

void check_shape(const char* op, const char* name, const Tensor& t, const Shape& shape) {
  TS_CHECK(t.shape() == shape, "[", op, "] expected ", name, " of shape ", shape_str(shape),
           ", found ", shape_str(t.shape()));
}

void check_like_param(const char* op, const Tensor& param, const char* name, const Tensor& t) {
  check_defined(op, name, t);
  check_same_dtype(op, "param", param, name, t);
  check_same_device(op, "param", param, name, t);
  check_same_shape(op, "param", param, name, t);
  TS_CHECK(t.is_contiguous(), "[", op, "] expected a contiguous ", name, ", found strides ",
           shape_str(t.strides()), " for shape ", shape_str(t.shape()));
}

Tensor contiguous_or_undefined(const Tensor& t) {
  return t.defined() ? t.detach().contiguous() : Tensor();
}

}  // namespace tessera::kernels
