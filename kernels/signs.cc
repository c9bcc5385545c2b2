// Validation and the device switch of the sign-bit kernels.
#include "kernels/signs.h"

#include "kernels/checks.h"
#include "kernels/cpu/signs.h"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels {

Tensor pack_signs(const Tensor& x) {
  check_defined("pack_signs", "x", x);
  check_floating("pack_signs", "x", x);
  TS_CHECK(x.dim() == 1 && x.is_contiguous(), "[pack_signs] expected a contiguous 1-D x, found ",
           "shape ", shape_str(x.shape()), " with strides ", shape_str(x.strides()));
  if (x.device().is_cuda()) return cuda::pack_signs(x);
  return cpu::pack_signs(x);
}

Tensor unpack_signs(const Tensor& bits, int64_t n, DType dtype) {
  check_defined("unpack_signs", "bits", bits);
  TS_CHECK(bits.dtype() == DType::u8 && bits.dim() == 1 && bits.is_contiguous(),
           "[unpack_signs] expected contiguous 1-D u8 bits, found ", dtype_name(bits.dtype()), " ",
           shape_str(bits.shape()));
  TS_CHECK(n >= 0 && bits.numel() * 8 >= n, "[unpack_signs] ", n, " signs need ", (n + 7) / 8,
           " bytes, found ", bits.numel());
  TS_CHECK(is_floating(dtype), "[unpack_signs] expected a floating dtype, found ",
           dtype_name(dtype));
  if (bits.device().is_cuda()) return cuda::unpack_signs(bits, n, dtype);
  return cpu::unpack_signs(bits, n, dtype);
}

}  // namespace tessera::kernels
