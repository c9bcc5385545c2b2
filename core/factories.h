// Tensor factories.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "core/philox.h"
#include "core/tensor.h"

namespace tessera {

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
};

// Uninitialized memory.
Tensor empty(const Shape& shape, TensorOptions options = {});
// A contiguous tensor of `shape` with no memory yet: materialized() is false and reading it
// is an error until its storage is reallocated (Note [Partitioned construction] in
// autograd/module.h).
Tensor unmaterialized(const Shape& shape, TensorOptions options = {});
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor full(const Shape& shape, double value, TensorOptions options = {});
// A 0-dim tensor holding `value`.
Tensor scalar_tensor(double value, TensorOptions options = {});
// start, start + step, ... below `end` (1-D); step must be non-zero.
Tensor arange(double start, double end, double step = 1.0, TensorOptions options = {});
inline Tensor arange(int64_t end, TensorOptions options = {}) {
  return arange(0.0, static_cast<double>(end), 1.0, options);
}
// Uniform in [low, high) from `gen` (advances it); floating dtypes only.
Tensor rand(const Shape& shape, Generator& gen, TensorOptions options = {}, double low = 0.0,
            double high = 1.0);
// Normal(mean, stddev) from `gen` by Box-Muller on Philox words (advances it).
Tensor randn(const Shape& shape, Generator& gen, TensorOptions options = {}, double mean = 0.0,
             double stddev = 1.0);
// Wraps existing memory without copying; `deleter` (may be empty) runs when the last
// view is gone. `data` must hold numel(shape) contiguous elements of `dtype`.
Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device = Device::cpu(),
                 std::function<void(void*)> deleter = {});

// A CPU bool tensor holding `values` with `shape` (std::vector<bool> has no data()).
Tensor from_vector(const std::vector<bool>& values, const Shape& shape);
Tensor from_vector(const std::vector<bool>& values);

// A CPU tensor holding a copy of `values` with `shape` (1-D when omitted).
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape) {
  TS_CHECK(numel_of(shape) == static_cast<int64_t>(values.size()), "[from_vector] shape ",
           shape_str(shape), " needs ", numel_of(shape), " values, found ", values.size());
  Tensor t = make_tensor(shape, dtype_of<T>(), Device::cpu());
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  return t;
}
template <class T>
Tensor from_vector(const std::vector<T>& values) {
  return from_vector(values, {static_cast<int64_t>(values.size())});
}

}  // namespace tessera
