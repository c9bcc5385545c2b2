#include "core/factories.h"

#include <algorithm>
#include <cmath>

#include "core/dispatch.h"
#include "core/parallel.h"

namespace tessera {
namespace {

// Fills a contiguous CPU buffer of n values from Philox words: value(out, i0, count, words)
// writes elements i0 .. i0 + count of one 4-word block. Block-parallel; reproducible for any
// thread count.
template <class T, class F>
void fill_from_philox(T* out, int64_t n, const Generator& gen, uint64_t offset, F&& value) {
  const int64_t blocks = (n + 3) / 4;
  parallel_for(blocks, 4096, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const std::array<uint32_t, 4> w =
          philox4x32(offset + static_cast<uint64_t>(b), 0, gen.seed());
      value(out, b * 4, std::min<int64_t>(4, n - b * 4), w);
    }
  });
}

// The largest value of the 16-bit float type H below `high`.
template <class H>
double largest_below_16(double high) {
  H h(static_cast<float>(high));
  while (static_cast<double>(static_cast<float>(h)) >= high) {
    // One step towards -inf in the sign-magnitude encoding.
    h.bits = static_cast<uint16_t>(h.bits == 0         ? 0x8001
                                   : (h.bits & 0x8000) ? h.bits + 1
                                                       : h.bits - 1);
  }
  return static_cast<float>(h);
}

// The largest value of floating `dtype` below `high`. A draw just under `high` can round
// up to `high` itself when stored (1 - 2^-24 is 1.0 in f16), which [low, high) forbids.
double largest_below(double high, DType dtype) {
  switch (dtype) {
    case DType::f64:
      return std::nextafter(high, -INFINITY);
    case DType::f32: {
      const float f = static_cast<float>(high);
      return static_cast<double>(f) < high ? f : std::nextafter(f, -INFINITY);
    }
    case DType::f16:
      return largest_below_16<Half>(high);
    case DType::bf16:
      return largest_below_16<BFloat16>(high);
    default:
      TS_INTERNAL_ASSERT(false, "largest_below of non-floating dtype ", dtype_name(dtype));
  }
}

Tensor finish_random(const Tensor& f64, TensorOptions options) {
  return f64.to(options.dtype).to(options.device);
}

}  // namespace

Tensor empty(const Shape& shape, TensorOptions options) {
  return make_tensor(shape, options.dtype, options.device);
}

Tensor unmaterialized(const Shape& shape, TensorOptions options) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage::allocate(0, options.device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = options.dtype;
  return Tensor(std::move(impl));
}

Tensor zeros(const Shape& shape, TensorOptions options) { return full(shape, 0.0, options); }

Tensor ones(const Shape& shape, TensorOptions options) { return full(shape, 1.0, options); }

Tensor full(const Shape& shape, double value, TensorOptions options) {
  Tensor t = empty(shape, options);
  t.fill_(value);
  return t;
}

Tensor scalar_tensor(double value, TensorOptions options) { return full({}, value, options); }

Tensor arange(double start, double end, double step, TensorOptions options) {
  TS_CHECK(step != 0.0, "[arange] expected a non-zero step, found 0");
  TS_CHECK(std::isfinite(start) && std::isfinite(end), "[arange] expected finite bounds, found [",
           start, ", ", end, ")");
  const int64_t n = std::max<int64_t>(0, static_cast<int64_t>(std::ceil((end - start) / step)));
  Tensor t = make_tensor({n}, DType::f64, Device::cpu());
  double* p = t.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) p[i] = start + static_cast<double>(i) * step;
  return t.to(options.dtype).to(options.device);
}

Tensor rand(const Shape& shape, Generator& gen, TensorOptions options, double low, double high) {
  TS_CHECK(is_floating(options.dtype), "[rand] expected a floating dtype, found ",
           dtype_name(options.dtype));
  const int64_t n = numel_of(shape);
  const uint64_t offset = gen.reserve(static_cast<uint64_t>(n));
  Tensor t = make_tensor(shape, DType::f64, Device::cpu());
  const double top = largest_below(high, options.dtype);
  fill_from_philox(t.data_ptr<double>(), n, gen, offset,
                   [&](double* out, int64_t i0, int64_t count, const std::array<uint32_t, 4>& w) {
                     for (int64_t j = 0; j < count; ++j) {
                       const double v = low + (high - low) * uniform_from_bits(w[j]);
                       out[i0 + j] = top >= low ? std::min(v, top) : v;
                     }
                   });
  return finish_random(t, options);
}

namespace {

// Box-Muller on Philox words, computed in f64 and stored as T: words (0, 1) give elements 0
// and 1 of a block, words (2, 3) elements 2 and 3.
template <class T>
void fill_normal(T* out, int64_t n, const Generator& gen, uint64_t offset, double mean,
                 double stddev) {
  fill_from_philox(
      out, n, gen, offset, [&](T* o, int64_t i0, int64_t count, const std::array<uint32_t, 4>& w) {
        for (int64_t j = 0; j < count; j += 2) {
          const double u1 = (static_cast<double>(w[j] >> 8) + 1.0) / 16777216.0;
          const double u2 = static_cast<double>(w[j + 1] >> 8) / 16777216.0;
          const double r = std::sqrt(-2.0 * std::log(u1));
          o[i0 + j] = static_cast<T>(mean + stddev * r * std::cos(2.0 * M_PI * u2));
          if (j + 1 < count) {
            o[i0 + j + 1] = static_cast<T>(mean + stddev * r * std::sin(2.0 * M_PI * u2));
          }
        }
      });
}

}  // namespace

Tensor randn(const Shape& shape, Generator& gen, TensorOptions options, double mean,
             double stddev) {
  TS_CHECK(is_floating(options.dtype), "[randn] expected a floating dtype, found ",
           dtype_name(options.dtype));
  const int64_t n = numel_of(shape);
  const uint64_t offset = gen.reserve(static_cast<uint64_t>(n));
  // f32 directly (no f64 staging copy: model initialization draws hundreds of MB); the
  // values equal the f64 draws rounded to f32.
  if (options.dtype == DType::f32) {
    Tensor t = make_tensor(shape, DType::f32, Device::cpu());
    fill_normal(t.data_ptr<float>(), n, gen, offset, mean, stddev);
    return t.to(options.device);
  }
  Tensor t = make_tensor(shape, DType::f64, Device::cpu());
  fill_normal(t.data_ptr<double>(), n, gen, offset, mean, stddev);
  return finish_random(t, options);
}

Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device,
                 std::function<void(void*)> deleter) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage::from_blob(data, static_cast<size_t>(numel_of(shape)) * itemsize(dtype),
                                     device, std::move(deleter));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor from_vector(const std::vector<bool>& values, const Shape& shape) {
  TS_CHECK(numel_of(shape) == static_cast<int64_t>(values.size()), "[from_vector] shape ",
           shape_str(shape), " needs ", numel_of(shape), " values, found ", values.size());
  Tensor t = make_tensor(shape, DType::boolean, Device::cpu());
  bool* p = t.data_ptr<bool>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}

Tensor from_vector(const std::vector<bool>& values) {
  return from_vector(values, {static_cast<int64_t>(values.size())});
}

}  // namespace tessera
