// CPU elementwise kernels: Eigen array expressions over strided spans.
//
// Note [Elementwise spans]
// Every kernel plans one loop over the output and its operands expanded to the output
// shape, then evaluates an Eigen expression per span (core/strided_loop.h). A span
// whose operands are contiguous maps them as plain arrays, so exp, tanh, log, sqrt and
// friends run on Eigen's SIMD packets; a broadcast operand (stride 0) of a binary op
// becomes a constant; anything else is read through a strided map. f16 and bf16 spans are
// converted to f32 buffers a chunk at a time, computed by the same f32 expression and
// rounded once into the output (half_span; Note [16-bit math on the CPU]).
#include "kernels/cpu/elementwise.h"

#include <cmath>
#include <type_traits>

#include "core/dispatch.h"
#include "core/factories.h"
#include "core/strided_loop.h"
#include "kernels/cpu/avx512_math.h"
#include "kernels/cpu/eigen_types.h"
#include "kernels/cpu/widen.h"

namespace tessera::kernels::cpu {
namespace {

template <class T>
using StridedMap = Eigen::Map<const ArrayX<T>, 0, Eigen::InnerStride<>>;

template <class T>
ArrayMap<T> out_map(char* p, int64_t n) {
  return ArrayMap<T>(reinterpret_cast<T*>(p), n);
}
template <class T>
ConstArrayMap<T> in_map(const char* p, int64_t n) {
  return ConstArrayMap<T>(reinterpret_cast<const T*>(p), n);
}
template <class T>
StridedMap<T> strided_map(const char* p, int64_t n, int64_t byte_stride) {
  return StridedMap<T>(reinterpret_cast<const T*>(p), n,
                       Eigen::InnerStride<>(byte_stride / static_cast<int64_t>(sizeof(T))));
}
template <class T>
T load(const char* p) {
  return *reinterpret_cast<const T*>(p);
}

// A raw view of `t` broadcast to `shape` (kernels never record graphs).
Tensor expanded(const Tensor& t, const Shape& shape) { return t.detach().expand(shape); }

// sqrt(2 / pi) and the cubic coefficient of the tanh approximation of GELU.
constexpr double kGeluScale = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;

// ---- unary ---------------------------------------------------------------------------------

// Forward math on any Eigen array expression x.
template <UnaryOp Op, class X>
auto unary_expr(const X& x) {
  using T = typename X::Scalar;
  if constexpr (Op == UnaryOp::neg) {
    return -x;
  } else if constexpr (Op == UnaryOp::exp) {
    return x.exp();
  } else if constexpr (Op == UnaryOp::log) {
    return x.log();
  } else if constexpr (Op == UnaryOp::sqrt) {
    return x.sqrt();
  } else if constexpr (Op == UnaryOp::rsqrt) {
    return x.rsqrt();
  } else if constexpr (Op == UnaryOp::tanh) {
    return x.tanh();
  } else if constexpr (Op == UnaryOp::relu) {
    // PropagateNaN: relu(NaN) is NaN, as in torch.
    return x.binaryExpr(ArrayX<T>::Zero(x.size()),
                        Eigen::internal::scalar_max_op<T, T, Eigen::PropagateNaN>());
  } else if constexpr (Op == UnaryOp::gelu) {
    // 0.5 x (1 + tanh(z)) = x / (1 + exp(-2z)): one vectorized exp instead of tanh, and
    // exact limits (x for large x, -0 for very negative x).
    return x * (T(2 * kGeluScale) * (x + T(kGeluCubic) * x.cube())).logistic();
  } else {
    static_assert(Op == UnaryOp::sigmoid);
    return x.logistic();
  }
}

// A span of 16-bit operands: chunks of kHalfChunk values converted to f32 buffers, the f32
// expression, each result rounded once (Note [16-bit math on the CPU]).
template <class T, int K, class F>
void half_span(const std::array<char*, K>& p, int64_t n, const std::array<int64_t, K>& st,
               F&& compute) {
  for (int64_t i0 = 0; i0 < n; i0 += kHalfChunk) {
    const int64_t len = std::min(kHalfChunk, n - i0);
    // v[0]: the result, v[i]: operand i; each kHalfChunk floats, so all stay aligned
    // (Note [Aligned scratch]).
    alignas(kCpuAlignment) std::array<std::array<float, kHalfChunk>, K> v;
    for (int i = 1; i < K; ++i) load_floats<T>(p[i] + i0 * st[i], st[i], len, v[i].data());
    compute(v, len);
    store_floats<T>(v[0].data(), len, reinterpret_cast<T*>(p[0]) + i0);
  }
}

// The f32 buffer of operand i of a half_span chunk, as an Eigen array.
template <size_t K>
ArrayMap<float> chunk(std::array<std::array<float, kHalfChunk>, K>& v, int i, int64_t len) {
  return ArrayMap<float>(v[i].data(), len);
}

#if defined(__AVX512F__)
// out[0, n) = gelu(in[0, n)) in f32 at memory speed (Note [Memory-bound kernels] in
// kernels/cpu/avx512_math.h); the same function as unary_expr's GELU. Each vector
// prefetches the input kPrefetchFloats ahead: its load feeds a long chain of arithmetic,
// which leaves the out-of-order core too few loads in flight to cover memory latency.
void gelu_avx512(const float* in, float* out, int64_t n) {
  for_each_vector(out, n, [&](int64_t i, __mmask16 m) {
    _mm_prefetch(reinterpret_cast<const char*>(in + i + kPrefetchFloats), _MM_HINT_T0);
    return gelu_tanh_avx512(_mm512_maskz_loadu_ps(m, in + i));
  });
}
#endif

template <class T, UnaryOp Op>
void unary_span(const std::array<char*, 2>& p, int64_t n, const std::array<int64_t, 2>& st) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float> && Op == UnaryOp::gelu) {
    if (st[1] == sizeof(T)) {
      gelu_avx512(reinterpret_cast<const float*>(p[1]), reinterpret_cast<float*>(p[0]), n);
      return;
    }
  }
#endif
  if constexpr (kIsHalf<T>) {
    half_span<T, 2>(p, n, st, [](auto& v, int64_t len) {
      chunk(v, 0, len) = unary_expr<Op>(chunk(v, 1, len));
    });
  } else if (st[1] == sizeof(T)) {  // out is contiguous: its stride is always one element
    out_map<T>(p[0], n) = unary_expr<Op>(in_map<T>(p[1], n));
  } else {
    out_map<T>(p[0], n) = unary_expr<Op>(strided_map<T>(p[1], n, st[1]));
  }
}

// ---- unary backward ------------------------------------------------------------------------

// out = g * op'(x), reading x or y (Note [Elementwise spans]).
template <UnaryOp Op, class O, class G, class X, class Y>
void unary_backward_expr(O&& out, const G& g, const X& x, const Y& y) {
  using T = typename G::Scalar;
  if constexpr (Op == UnaryOp::neg) {
    out = -g;
  } else if constexpr (Op == UnaryOp::exp) {
    out = g * y;
  } else if constexpr (Op == UnaryOp::log) {
    out = g / x;
  } else if constexpr (Op == UnaryOp::sqrt) {
    out = T(0.5) * g / y;
  } else if constexpr (Op == UnaryOp::rsqrt) {
    out = T(-0.5) * g * y.cube();
  } else if constexpr (Op == UnaryOp::tanh) {
    out = g * (T(1) - y.square());
  } else if constexpr (Op == UnaryOp::relu) {
    out = (x > T(0)).select(g, T(0));  // relu'(0) = 0
  } else if constexpr (Op == UnaryOp::gelu) {
    // tanh is evaluated once into a span-sized temporary, then reused twice.
    const ArrayX<T> t = (T(kGeluScale) * (x + T(kGeluCubic) * x.cube())).tanh();
    out = g * (T(0.5) * (T(1) + t) + T(0.5 * kGeluScale) * x * (T(1) - t.square()) *
                                         (T(1) + T(3 * kGeluCubic) * x.square()));
  } else {
    static_assert(Op == UnaryOp::sigmoid);
    out = g * y * (T(1) - y);
  }
}

template <class T, UnaryOp Op>
void unary_backward_span(const std::array<char*, 4>& p, int64_t n,
                         const std::array<int64_t, 4>& st) {
  if constexpr (kIsHalf<T>) {
    half_span<T, 4>(p, n, st, [](auto& v, int64_t len) {
      unary_backward_expr<Op>(chunk(v, 0, len), chunk(v, 1, len), chunk(v, 2, len),
                              chunk(v, 3, len));
    });
  } else if (st[1] == sizeof(T) && st[2] == sizeof(T) && st[3] == sizeof(T)) {
    unary_backward_expr<Op>(out_map<T>(p[0], n), in_map<T>(p[1], n), in_map<T>(p[2], n),
                            in_map<T>(p[3], n));
  } else {
    unary_backward_expr<Op>(out_map<T>(p[0], n), strided_map<T>(p[1], n, st[1]),
                            strided_map<T>(p[2], n, st[2]), strided_map<T>(p[3], n, st[3]));
  }
}

// ---- binary --------------------------------------------------------------------------------

template <BinaryOp Op, class A, class B>
auto binary_expr(const A& a, const B& b) {
  using T = typename A::Scalar;
  if constexpr (Op == BinaryOp::add) {
    return a + b;
  } else if constexpr (Op == BinaryOp::sub) {
    return a - b;
  } else if constexpr (Op == BinaryOp::mul) {
    return a * b;
  } else if constexpr (Op == BinaryOp::div) {
    return a / b;
  } else if constexpr (Op == BinaryOp::pow) {
    return a.pow(b);
  } else if constexpr (Op == BinaryOp::maximum) {
    // NaN in either operand gives NaN, as torch.maximum.
    return a.binaryExpr(b, Eigen::internal::scalar_max_op<T, T, Eigen::PropagateNaN>());
  } else {
    static_assert(Op == BinaryOp::minimum);
    return a.binaryExpr(b, Eigen::internal::scalar_min_op<T, T, Eigen::PropagateNaN>());
  }
}

// binary_span for f32 and f64: Eigen expressions on the operands in place.
template <class T, BinaryOp Op>
void binary_span_wide(const std::array<char*, 3>& p, int64_t n, const std::array<int64_t, 3>& st) {
  const bool dense_a = st[1] == sizeof(T);
  const bool dense_b = st[2] == sizeof(T);
  if (dense_a && dense_b) {
    out_map<T>(p[0], n) = binary_expr<Op>(in_map<T>(p[1], n), in_map<T>(p[2], n));
  } else if (dense_a && st[2] == 0) {
    out_map<T>(p[0], n) =
        binary_expr<Op>(in_map<T>(p[1], n), ArrayX<T>::Constant(n, load<T>(p[2])));
  } else if (st[1] == 0 && dense_b) {
    out_map<T>(p[0], n) =
        binary_expr<Op>(ArrayX<T>::Constant(n, load<T>(p[1])), in_map<T>(p[2], n));
  } else {
    out_map<T>(p[0], n) =
        binary_expr<Op>(strided_map<T>(p[1], n, st[1]), strided_map<T>(p[2], n, st[2]));
  }
}

template <class T, BinaryOp Op>
void binary_span(const std::array<char*, 3>& p, int64_t n, const std::array<int64_t, 3>& st) {
  if constexpr (kIsHalf<T>) {
    half_span<T, 3>(p, n, st, [](auto& v, int64_t len) {
      chunk(v, 0, len) = binary_expr<Op>(chunk(v, 1, len), chunk(v, 2, len));
    });
  } else {
    binary_span_wide<T, Op>(p, n, st);
  }
}

// ---- compare and where ---------------------------------------------------------------------

template <CompareOp Op, class T>
bool compare_values(T a, T b) {
  if constexpr (kIsHalf<T>) {
    return compare_values<Op>(static_cast<float>(a), static_cast<float>(b));
  } else if constexpr (Op == CompareOp::eq) {
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

template <class T, CompareOp Op>
void compare_span(const std::array<char*, 3>& p, int64_t n, const std::array<int64_t, 3>& st) {
  bool* out = reinterpret_cast<bool*>(p[0]);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = compare_values<Op>(load<T>(p[1] + i * st[1]), load<T>(p[2] + i * st[2]));
  }
}

template <class T>
void where_span(const std::array<char*, 4>& p, int64_t n, const std::array<int64_t, 4>& st) {
  T* out = reinterpret_cast<T*>(p[0]);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = load<bool>(p[1] + i * st[1]) ? load<T>(p[2] + i * st[2]) : load<T>(p[3] + i * st[3]);
  }
}

}  // namespace

Tensor unary(UnaryOp op, const Tensor& x) {  // (*) -> (*)
  Tensor out = empty(x.shape(), {x.dtype(), x.device()});
  dispatch_floating_and_half(x.dtype(), unary_name(op), [&](auto tag) {
    using T = typename decltype(tag)::type;
    switch (op) {
      case UnaryOp::neg:
        return for_each_span<2>({out, x}, unary_span<T, UnaryOp::neg>);
      case UnaryOp::exp:
        return for_each_span<2>({out, x}, unary_span<T, UnaryOp::exp>);
      case UnaryOp::log:
        return for_each_span<2>({out, x}, unary_span<T, UnaryOp::log>);
      case UnaryOp::sqrt:
        return for_each_span<2>({out, x}, unary_span<T, UnaryOp::sqrt>);
      case UnaryOp::rsqrt:
        return for_each_span<2>({out, x}, unary_span<T, UnaryOp::rsqrt>);
      case UnaryOp::tanh:
        return for_each_span<2>({out, x}, unary_span<T, UnaryOp::tanh>);
      case UnaryOp::relu:
        return for_each_span<2>({out, x}, unary_span<T, UnaryOp::relu>);
      case UnaryOp::gelu:
        return for_each_span<2>({out, x}, unary_span<T, UnaryOp::gelu>);
      case UnaryOp::sigmoid:
        return for_each_span<2>({out, x}, unary_span<T, UnaryOp::sigmoid>);
    }
  });
  return out;
}

Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x,
                      const Tensor& y) {  // (*), (*), (*) -> (*)
  Tensor out = empty(grad.shape(), {grad.dtype(), grad.device()});
  // An operand op' does not read stands in as grad, so the loop has one shape.
  const Tensor& xs = x.defined() ? x : grad;
  const Tensor& ys = y.defined() ? y : grad;
  dispatch_floating_and_half(grad.dtype(), unary_name(op), [&](auto tag) {
    using T = typename decltype(tag)::type;
    switch (op) {
      case UnaryOp::neg:
        return for_each_span<4>({out, grad, xs, ys}, unary_backward_span<T, UnaryOp::neg>);
      case UnaryOp::exp:
        return for_each_span<4>({out, grad, xs, ys}, unary_backward_span<T, UnaryOp::exp>);
      case UnaryOp::log:
        return for_each_span<4>({out, grad, xs, ys}, unary_backward_span<T, UnaryOp::log>);
      case UnaryOp::sqrt:
        return for_each_span<4>({out, grad, xs, ys}, unary_backward_span<T, UnaryOp::sqrt>);
      case UnaryOp::rsqrt:
        return for_each_span<4>({out, grad, xs, ys}, unary_backward_span<T, UnaryOp::rsqrt>);
      case UnaryOp::tanh:
        return for_each_span<4>({out, grad, xs, ys}, unary_backward_span<T, UnaryOp::tanh>);
      case UnaryOp::relu:
        return for_each_span<4>({out, grad, xs, ys}, unary_backward_span<T, UnaryOp::relu>);
      case UnaryOp::gelu:
        return for_each_span<4>({out, grad, xs, ys}, unary_backward_span<T, UnaryOp::gelu>);
      case UnaryOp::sigmoid:
        return for_each_span<4>({out, grad, xs, ys}, unary_backward_span<T, UnaryOp::sigmoid>);
    }
  });
  return out;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {  // (*a), (*b) -> broadcast
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), binary_name(op));
  Tensor out = empty(shape, {a.dtype(), a.device()});
  const Tensor av = expanded(a, shape);
  const Tensor bv = expanded(b, shape);
  dispatch_floating_and_half(a.dtype(), binary_name(op), [&](auto tag) {
    using T = typename decltype(tag)::type;
    switch (op) {
      case BinaryOp::add:
        return for_each_span<3>({out, av, bv}, binary_span<T, BinaryOp::add>);
      case BinaryOp::sub:
        return for_each_span<3>({out, av, bv}, binary_span<T, BinaryOp::sub>);
      case BinaryOp::mul:
        return for_each_span<3>({out, av, bv}, binary_span<T, BinaryOp::mul>);
      case BinaryOp::div:
        return for_each_span<3>({out, av, bv}, binary_span<T, BinaryOp::div>);
      case BinaryOp::pow:
        return for_each_span<3>({out, av, bv}, binary_span<T, BinaryOp::pow>);
      case BinaryOp::maximum:
        return for_each_span<3>({out, av, bv}, binary_span<T, BinaryOp::maximum>);
      case BinaryOp::minimum:
        return for_each_span<3>({out, av, bv}, binary_span<T, BinaryOp::minimum>);
    }
  });
  return out;
}

Tensor compare(CompareOp op, const Tensor& a, const Tensor& b) {  // (*a), (*b) -> broadcast
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), compare_name(op));
  Tensor out = empty(shape, {DType::boolean, a.device()});
  const Tensor av = expanded(a, shape);
  const Tensor bv = expanded(b, shape);
  dispatch_all(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    switch (op) {
      case CompareOp::eq:
        return for_each_span<3>({out, av, bv}, compare_span<T, CompareOp::eq>);
      case CompareOp::ne:
        return for_each_span<3>({out, av, bv}, compare_span<T, CompareOp::ne>);
      case CompareOp::lt:
        return for_each_span<3>({out, av, bv}, compare_span<T, CompareOp::lt>);
      case CompareOp::le:
        return for_each_span<3>({out, av, bv}, compare_span<T, CompareOp::le>);
      case CompareOp::gt:
        return for_each_span<3>({out, av, bv}, compare_span<T, CompareOp::gt>);
      case CompareOp::ge:
        return for_each_span<3>({out, av, bv}, compare_span<T, CompareOp::ge>);
    }
  });
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {  // -> broadcast of all 3
  const Shape shape =
      broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor out = empty(shape, {a.dtype(), a.device()});
  const Tensor cv = expanded(cond, shape);
  const Tensor av = expanded(a, shape);
  const Tensor bv = expanded(b, shape);
  dispatch_all(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_span<4>({out, cv, av, bv}, where_span<T>);
  });
  return out;
}

}  // namespace tessera::kernels::cpu
