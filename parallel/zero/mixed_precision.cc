#include "parallel/zero/mixed_precision.h"

#include "core/error.h"

namespace tessera::parallel {

DType MixedPrecision::accumulation_dtype(int stage) const {
  if (stage >= 2) return DType::f32;
  return accumulation.value_or(dtype == DType::bf16 ? DType::f32 : dtype);
}

void check_mixed_precision(const MixedPrecision& precision, int stage) {
  const DType dtype = precision.dtype;
  TS_CHECK(dtype == DType::f32 || is_half(dtype),
           "[zero] expected a parameter precision of f32, f16 or bf16, found ", dtype_name(dtype));
  const DType comm = precision.communication_dtype();
  TS_CHECK(comm == DType::f32 || is_half(comm),
           "[zero] expected a communication dtype of f32, f16 or bf16, found ", dtype_name(comm));
  TS_CHECK(comm != DType::f16 || dtype == DType::f16,
           "[zero] f16 reductions need f16 training's loss scaling and overflow check; expected "
           "f32 or bf16 communication with ",
           dtype_name(dtype), " parameters, found f16");
  if (!precision.accumulation) return;
  const DType accumulation = *precision.accumulation;
  TS_CHECK(accumulation == DType::f32 || accumulation == dtype,
           "[zero] gradients accumulate in f32 or in the parameters' ", dtype_name(dtype),
           "; expected one of them, found ", dtype_name(accumulation));
  TS_CHECK(stage < 2 || accumulation == DType::f32, "[zero] stage ", stage,
           " adds each micro-batch's reduced gradient into an f32 shard; expected f32 "
           "gradient accumulation, found ",
           dtype_name(accumulation));
}

}  // namespace tessera::parallel
