// CUDA elementwise kernels: unary math and its backward, broadcasting binary ops,
// comparisons and where.
//
// The launches over broadcast operands are in kernels/cuda/elementwise_launch.cuh (Note
// [Elementwise layouts on the device]).

#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/factories.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise_launch.cuh"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels::cuda {
namespace {

// ---- Math in the accumulation type ------------------------------------------------------

__device__ __forceinline__ float m_exp(float v) { return expf(v); }
__device__ __forceinline__ double m_exp(double v) { return exp(v); }
__device__ __forceinline__ float m_log(float v) { return logf(v); }
__device__ __forceinline__ double m_log(double v) { return log(v); }
__device__ __forceinline__ float m_sqrt(float v) { return sqrtf(v); }
__device__ __forceinline__ double m_sqrt(double v) { return sqrt(v); }
__device__ __forceinline__ float m_tanh(float v) { return tanhf(v); }
__device__ __forceinline__ double m_tanh(double v) { return tanh(v); }
__device__ __forceinline__ float m_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double m_pow(double a, double b) { return pow(a, b); }

// sqrt(2 / pi) and the cubic coefficient of the tanh approximation of GELU (as the CPU).
constexpr double kGeluScale = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;

template <UnaryOp Op, class A>
__device__ __forceinline__ A unary_math(A x) {
  if constexpr (Op == UnaryOp::neg) {
    return -x;
  } else if constexpr (Op == UnaryOp::exp) {
    return m_exp(x);
  } else if constexpr (Op == UnaryOp::log) {
    return m_log(x);
  } else if constexpr (Op == UnaryOp::sqrt) {
    return m_sqrt(x);
  } else if constexpr (Op == UnaryOp::rsqrt) {
    return A(1) / m_sqrt(x);  // not rsqrtf: its 2 ulp would break parity with the CPU
  } else if constexpr (Op == UnaryOp::tanh) {
    return m_tanh(x);
  } else if constexpr (Op == UnaryOp::relu) {
    return x < A(0) ? A(0) : x;  // std::max(x, 0): NaN stays NaN, as in torch
  } else if constexpr (Op == UnaryOp::gelu) {
    // 0.5 x (1 + tanh(z)) = x / (1 + exp(-2z)), as the CPU: exact limits (x for large x,
    // -0 for very negative x).
    const A t = A(2 * kGeluScale) * (x + A(kGeluCubic) * (x * x * x));
    return x / (A(1) + m_exp(-t));
  } else {
    static_assert(Op == UnaryOp::sigmoid);
    return A(1) / (A(1) + m_exp(-x));
  }
}

template <class T, UnaryOp Op>
struct UnaryFn {
  __device__ __forceinline__ T operator()(T x) const {
    return from_acc<T>(unary_math<Op>(to_acc(x)));
  }
};

// Which forward tensor op' reads (as kernels/elementwise.cc).
enum class Saved : uint8_t { none, input, output };

constexpr Saved saved_of(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg:
      return Saved::none;
    case UnaryOp::log:
    case UnaryOp::relu:
    case UnaryOp::gelu:
      return Saved::input;
    default:
      return Saved::output;
  }
}

// grad * op'(s), s being x or y as saved_of says.
template <UnaryOp Op, class A>
__device__ __forceinline__ A unary_grad_math(A g, A s) {
  if constexpr (Op == UnaryOp::exp) {
    return g * s;
  } else if constexpr (Op == UnaryOp::log) {
    return g / s;
  } else if constexpr (Op == UnaryOp::sqrt) {
    return A(0.5) * g / s;
  } else if constexpr (Op == UnaryOp::rsqrt) {
    return A(-0.5) * g * (s * s * s);
  } else if constexpr (Op == UnaryOp::tanh) {
    return g * (A(1) - s * s);
  } else if constexpr (Op == UnaryOp::relu) {
    return s > A(0) ? g : A(0);  // relu'(0) = 0
  } else if constexpr (Op == UnaryOp::gelu) {
    const A t = m_tanh(A(kGeluScale) * (s + A(kGeluCubic) * (s * s * s)));
    return g * (A(0.5) * (A(1) + t) +
                A(0.5 * kGeluScale) * s * (A(1) - t * t) * (A(1) + A(3 * kGeluCubic) * (s * s)));
  } else {
    static_assert(Op == UnaryOp::sigmoid);
    return g * s * (A(1) - s);
  }
}

template <class T, UnaryOp Op>
struct UnaryGradFn {
  __device__ __forceinline__ T operator()(T g) const {  // neg
    return from_acc<T>(-to_acc(g));
  }
  __device__ __forceinline__ T operator()(T g, T s) const {
    return from_acc<T>(unary_grad_math<Op>(to_acc(g), to_acc(s)));
  }
};

template <BinaryOp Op, class A>
__device__ __forceinline__ A binary_math(A a, A b) {
  if constexpr (Op == BinaryOp::add) {
    return a + b;
  } else if constexpr (Op == BinaryOp::sub) {
    return a - b;
  } else if constexpr (Op == BinaryOp::mul) {
    return a * b;
  } else if constexpr (Op == BinaryOp::div) {
    return a / b;
  } else if constexpr (Op == BinaryOp::pow) {
    return m_pow(a, b);  // C99 pow special cases, as std::pow on the CPU
  } else if constexpr (Op == BinaryOp::maximum) {
    // NaN in either operand gives that NaN, as torch.maximum (and Eigen's PropagateNaN).
    return a != a ? a : b != b ? b : (a < b ? b : a);
  } else {
    static_assert(Op == BinaryOp::minimum);
    return a != a ? a : b != b ? b : (b < a ? b : a);
  }
}

template <class T, BinaryOp Op>
struct BinaryFn {
  __device__ __forceinline__ T operator()(T a, T b) const {
    return from_acc<T>(binary_math<Op>(to_acc(a), to_acc(b)));
  }
};

// Half types compare as float; every other type as itself.
template <class T>
__device__ __forceinline__ auto comparable(T v) {
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    return to_acc(v);
  } else {
    return v;
  }
}

template <class T, CompareOp Op>
struct CompareFn {
  __device__ __forceinline__ bool operator()(T a_in, T b_in) const {
    const auto a = comparable(a_in);
    const auto b = comparable(b_in);
    if constexpr (Op == CompareOp::eq) {
      return a == b;
    } else if constexpr (Op == CompareOp::ne) {
      return a != b;
    } else if constexpr (Op == CompareOp::lt) {
      return a < b;
    } else if constexpr (Op == CompareOp::le) {
      return a <= b;
    } else if constexpr (Op == CompareOp::gt) {
      return a > b;
    } else {
      static_assert(Op == CompareOp::ge);
      return a >= b;
    }
  }
};

// cond ? a : b, the values moved as raw bits of their size (U is an unsigned integer of
// the dtype's itemsize).
template <class I, class U>
__global__ void __launch_bounds__(kThreads)
    where_kernel(U* __restrict__ out, const uint8_t* cond, const U* a, const U* b, Layout<3> layout,
                 bool dense, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    int64_t off[3] = {i, i, i};
    if (!dense) layout.offsets(static_cast<I>(i), off);
    out[i] = cond[off[0]] != 0 ? a[off[1]] : b[off[2]];
  }
}

// ---- Dispatch helpers --------------------------------------------------------------------

// Calls f(TypeTag<T>{}) with the device type of any dtype (bool as bool).
template <class F>
decltype(auto) dispatch_any(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32:
      return f(TypeTag<float>{});
    case DType::f64:
      return f(TypeTag<double>{});
    case DType::f16:
      return f(TypeTag<__half>{});
    case DType::bf16:
      return f(TypeTag<__nv_bfloat16>{});
    case DType::i32:
      return f(TypeTag<int32_t>{});
    case DType::i64:
      return f(TypeTag<int64_t>{});
    case DType::u8:
      return f(TypeTag<uint8_t>{});
    case DType::boolean:
      return f(TypeTag<bool>{});
  }
  TS_FAIL("[", op, "] unknown dtype ", static_cast<int>(dtype));
}

template <class F>
void dispatch_unary_op(UnaryOp op, F&& f) {
  switch (op) {
    case UnaryOp::neg:
      return f(std::integral_constant<UnaryOp, UnaryOp::neg>{});
    case UnaryOp::exp:
      return f(std::integral_constant<UnaryOp, UnaryOp::exp>{});
    case UnaryOp::log:
      return f(std::integral_constant<UnaryOp, UnaryOp::log>{});
    case UnaryOp::sqrt:
      return f(std::integral_constant<UnaryOp, UnaryOp::sqrt>{});
    case UnaryOp::rsqrt:
      return f(std::integral_constant<UnaryOp, UnaryOp::rsqrt>{});
    case UnaryOp::tanh:
      return f(std::integral_constant<UnaryOp, UnaryOp::tanh>{});
    case UnaryOp::relu:
      return f(std::integral_constant<UnaryOp, UnaryOp::relu>{});
    case UnaryOp::gelu:
      return f(std::integral_constant<UnaryOp, UnaryOp::gelu>{});
    case UnaryOp::sigmoid:
      return f(std::integral_constant<UnaryOp, UnaryOp::sigmoid>{});
  }
  TS_FAIL("[unary] unknown op ", static_cast<int>(op));
}

template <class F>
void dispatch_binary_op(BinaryOp op, F&& f) {
  switch (op) {
    case BinaryOp::add:
      return f(std::integral_constant<BinaryOp, BinaryOp::add>{});
    case BinaryOp::sub:
      return f(std::integral_constant<BinaryOp, BinaryOp::sub>{});
    case BinaryOp::mul:
      return f(std::integral_constant<BinaryOp, BinaryOp::mul>{});
    case BinaryOp::div:
      return f(std::integral_constant<BinaryOp, BinaryOp::div>{});
    case BinaryOp::pow:
      return f(std::integral_constant<BinaryOp, BinaryOp::pow>{});
    case BinaryOp::maximum:
      return f(std::integral_constant<BinaryOp, BinaryOp::maximum>{});
    case BinaryOp::minimum:
      return f(std::integral_constant<BinaryOp, BinaryOp::minimum>{});
  }
  TS_FAIL("[binary] unknown op ", static_cast<int>(op));
}

template <class F>
void dispatch_compare_op(CompareOp op, F&& f) {
  switch (op) {
    case CompareOp::eq:
      return f(std::integral_constant<CompareOp, CompareOp::eq>{});
    case CompareOp::ne:
      return f(std::integral_constant<CompareOp, CompareOp::ne>{});
    case CompareOp::lt:
      return f(std::integral_constant<CompareOp, CompareOp::lt>{});
    case CompareOp::le:
      return f(std::integral_constant<CompareOp, CompareOp::le>{});
    case CompareOp::gt:
      return f(std::integral_constant<CompareOp, CompareOp::gt>{});
    case CompareOp::ge:
      return f(std::integral_constant<CompareOp, CompareOp::ge>{});
  }
  TS_FAIL("[compare] unknown op ", static_cast<int>(op));
}

}  // namespace

Tensor unary(UnaryOp op, const Tensor& x) {  // (*) -> (*)
  const char* name = unary_name(op);
  set_device(name, x);
  Tensor out = empty(x.shape(), {x.dtype(), x.device()});
  dispatch_cuda_floating(x.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_unary_op(op, [&](auto op_tag) {
      constexpr UnaryOp kOp = decltype(op_tag)::value;
      launch_map<T, T, 1>(name, out, {x}, UnaryFn<T, kOp>{});
    });
  });
  return out;
}

Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x,
                      const Tensor& y) {  // (*), (*), (*) -> (*)
  const char* name = unary_name(op);
  set_device(name, grad);
  Tensor out = empty(grad.shape(), {grad.dtype(), grad.device()});
  dispatch_cuda_floating(grad.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_unary_op(op, [&](auto op_tag) {
      constexpr UnaryOp kOp = decltype(op_tag)::value;
      constexpr Saved kSaved = saved_of(kOp);
      // Only the forward tensor op' reads is loaded (the wrapper checked it is defined).
      if constexpr (kSaved == Saved::none) {
        launch_map<T, T, 1>(name, out, {grad}, UnaryGradFn<T, kOp>{});
      } else {
        const Tensor& s = kSaved == Saved::input ? x : y;
        launch_map<T, T, 2>(name, out, {grad, s}, UnaryGradFn<T, kOp>{});
      }
    });
  });
  return out;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {  // (*a), (*b) -> broadcast
  const char* name = binary_name(op);
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  set_device(name, a);
  Tensor out = empty(shape, {a.dtype(), a.device()});
  dispatch_cuda_floating(a.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_binary_op(op, [&](auto op_tag) {
      constexpr BinaryOp kOp = decltype(op_tag)::value;
      launch_map<T, T, 2>(name, out, {a, b}, BinaryFn<T, kOp>{});
    });
  });
  return out;
}

Tensor compare(CompareOp op, const Tensor& a, const Tensor& b) {  // (*a), (*b) -> broadcast
  const char* name = compare_name(op);
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  set_device(name, a);
  Tensor out = empty(shape, {DType::boolean, a.device()});
  dispatch_any(a.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_compare_op(op, [&](auto op_tag) {
      constexpr CompareOp kOp = decltype(op_tag)::value;
      launch_map<T, bool, 2>(name, out, {a, b}, CompareFn<T, kOp>{});
    });
  });
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a,
             const Tensor& b) {  // (*c) bool, (*a), (*b) -> broadcast of all three
  const Shape shape =
      broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  set_device("where", a);
  Tensor out = empty(shape, {a.dtype(), a.device()});
  const int64_t n = out.numel();
  if (n == 0) return out;
  const Layout<3> layout = make_layout<3>("where", {cond, a, b}, shape);
  const bool dense = layout.dense();
  auto launch = [&](auto tag) {
    using U = typename decltype(tag)::type;
    if (fits_u32(n)) {
      where_kernel<uint32_t, U><<<grid_for(n), kThreads, 0, kStream>>>(
          ptr<U>(out), ptr<const uint8_t>(cond), ptr<const U>(a), ptr<const U>(b), layout, dense,
          n);
    } else {
      where_kernel<uint64_t, U><<<grid_for(n), kThreads, 0, kStream>>>(
          ptr<U>(out), ptr<const uint8_t>(cond), ptr<const U>(a), ptr<const U>(b), layout, dense,
          n);
    }
  };
  switch (a.itemsize()) {
    case 1:
      launch(TypeTag<uint8_t>{});
      break;
    case 2:
      launch(TypeTag<uint16_t>{});
      break;
    case 4:
      launch(TypeTag<uint32_t>{});
      break;
    case 8:
      launch(TypeTag<uint64_t>{});
      break;
    default:
      TS_FAIL("[where] expected an itemsize of 1, 2, 4 or 8 bytes, found ", a.itemsize());
  }
  check_launch("where");
  return out;
}

}  // namespace tessera::kernels::cuda
