#include "examples/custom_op/fused_bias_gelu.h"

#include <cmath>

#include "autograd/node.h"
#include "autograd/record.h"
#include "core/dispatch.h"
#include "core/factories.h"
#include "core/parallel.h"

namespace example {
namespace {

using tessera::Tensor;
using tessera::TensorList;

constexpr double kSqrt2OverPi = 0.7978845608028654;

// The CPU kernel: one pass over rows; returns y and, when wanted, dy/du at each element.
template <class T>
void bias_gelu_rows(const T* x, const T* bias, T* y, T* dydu, int64_t rows, int64_t c) {
  tessera::parallel_for(rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t j = 0; j < c; ++j) {
        const double u = static_cast<double>(x[r * c + j]) + static_cast<double>(bias[j]);
        const double inner = kSqrt2OverPi * (u + 0.044715 * u * u * u);
        const double t = std::tanh(inner);
        y[r * c + j] = static_cast<T>(0.5 * u * (1.0 + t));
        if (dydu) {
          const double dinner = kSqrt2OverPi * (1.0 + 3.0 * 0.044715 * u * u);
          dydu[r * c + j] = static_cast<T>(0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * dinner);
        }
      }
    }
  });
}

// The backward node: saves dy/du from the forward (no recomputation needed).
class FusedBiasGeluBackward final : public tessera::Node {
 public:
  FusedBiasGeluBackward(Tensor dydu, bool bias_needed)
      : dydu_(std::move(dydu)), bias_needed_(bias_needed) {}
  std::string name() const override { return "fused_bias_gelu"; }
  TensorList apply(const TensorList& grads) override {
    TS_CHECK(dydu_.defined(), "[fused_bias_gelu] graph already freed");
    Tensor g = grads[0].contiguous();
    const int64_t c = dydu_.size(-1);
    const int64_t rows = dydu_.numel() / c;
    Tensor dx = tessera::empty(dydu_.shape(), {dydu_.dtype()});
    Tensor dbias = tessera::zeros({c}, {dydu_.dtype()});
    tessera::dispatch_floating(dydu_.dtype(), "fused_bias_gelu", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* gp = g.data_ptr<T>();
      const T* d = dydu_.data_ptr<T>();
      T* dxp = dx.data_ptr<T>();
      T* db = dbias.data_ptr<T>();
      for (int64_t i = 0; i < rows * c; ++i) dxp[i] = gp[i] * d[i];
      if (bias_needed_) {
        for (int64_t i = 0; i < rows * c; ++i) db[i % c] += dxp[i];
      }
    });
    return {dx, bias_needed_ ? dbias : Tensor()};
  }
  void release_saved() override { dydu_ = Tensor(); }

 private:
  Tensor dydu_;  // (..., C)
  bool bias_needed_;
};

}  // namespace

Tensor fused_bias_gelu(const Tensor& x, const Tensor& bias) {
  TS_CHECK(x.dim() >= 1 && bias.shape() == tessera::Shape{x.size(-1)},
           "[fused_bias_gelu] expected bias of shape (", x.size(-1), "), found ",
           tessera::shape_str(bias.shape()));
  TS_CHECK(x.dtype() == bias.dtype() && x.device().is_cpu() && bias.device().is_cpu(),
           "[fused_bias_gelu] expected CPU tensors of one dtype, found ", x.str(), " and ",
           bias.str());
  const bool record = tessera::needs_grad({&x, &bias});
  Tensor xc = x.detach().contiguous();
  Tensor bc = bias.detach().contiguous();
  Tensor y = tessera::empty(x.shape(), {x.dtype()});
  Tensor dydu = record ? tessera::empty(x.shape(), {x.dtype()}) : Tensor();
  const int64_t c = x.size(-1);
  tessera::dispatch_floating(x.dtype(), "fused_bias_gelu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    bias_gelu_rows<T>(xc.data_ptr<T>(), bc.data_ptr<T>(), y.data_ptr<T>(),
                      record ? dydu.data_ptr<T>() : nullptr, x.numel() / c, c);
  });
  if (record) {
    tessera::record(std::make_shared<FusedBiasGeluBackward>(dydu, bias.requires_grad()), {x, bias},
                    {&y});
  }
  return y;
}

}  // namespace example
