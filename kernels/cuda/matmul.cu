// cuda::matmul through cuBLASLt: TF32 tensor cores for f32, bf16/f16 tensor cores with
// f32 accumulation, f64 in double.
//
// Note [Row-major GEMM through column-major cuBLAS]
// A row-major (M, N) matrix is the column-major (N, M) matrix with the same bytes. So
// C = op(A) op(B) in row-major is C^T = op(B)^T op(A)^T in column-major: cuBLASLt gets
// b's buffer as its first operand and a's as its second, each with its own transpose
// flag, and writes C with no copy. An operand whose last two dims are a transposed
// contiguous matrix (strides (1, rows)) is passed as that matrix with the flag flipped,
// so x.transpose(-2, -1) costs no copy either.
//
// Note [cuBLASLt alignment]
// cuBLASLt's heuristic assumes 256-byte aligned operands unless told otherwise, and an
// algorithm it picks under that assumption fails on a view at an odd offset (parameters
// are views of ZeRO's flat buffer at any element offset). So each call states the real
// alignment of every pointer (the largest power of two up to 256 that divides it), which
// is also part of the key of the cached algorithm. The bias epilogue wants a 16-byte
// aligned bias; a bias that is not gets a separate add after the GEMM.
#include <cublasLt.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <tuple>

#include "core/factories.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace tessera::kernels::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLAS's recommendation for Hopper

void check_cublas(cublasStatus_t status, const char* call) {
  TS_CHECK(status == CUBLAS_STATUS_SUCCESS, "[matmul] ", call,
           " failed: ", cublasLtGetStatusName(status), " (", cublasLtGetStatusString(status), ")");
}

// What a GEMM's epilogue does besides the product: nothing, add a bias to every row of the
// result, also write op(a)'s sums over K, one per row of the result (Note [Bias gradient
// epilogue]), add the bias (if any) and apply GELU keeping its input, or multiply by GELU's
// derivative at a kept input and write the sums over the rows (Note [GELU epilogues]).
enum class Epilogue { none, bias, bias_grad, gelu_aux, dgelu_bias_grad };

// Whether cuBLASLt may refuse the epilogue for some operands, the caller then computing
// without it.
bool may_refuse(Epilogue e) { return e != Epilogue::none && e != Epilogue::bias; }

// Everything the chosen algorithm depends on: dtype, flags, layouts, batch, the operands'
// alignments (Note [cuBLASLt alignment]) and the epilogue.
using AlgoKey = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int64_t, int64_t, uint32_t, uint32_t, uint32_t, int>;

// The largest power of two, at most 256, that divides the address.
uint32_t alignment_of(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

constexpr uint32_t kBiasAlignment = 16;

// Note [cuBLASLt per thread]
// One cuBLASLt call may launch several kernels that pass data through the workspace (a
// split-K GEMM and its reduction). Two host threads' calls on the device's one stream
// (thread ranks sharing a GPU) interleave their launches, so with one workspace a thread's
// reduction can read the other's partial sums: on an H200, a GPT backward from two threads
// differed from one thread's, under CUDA_LAUNCH_BLOCKING=1 too (tests/gpu/threads_gpu_test.cc).
// So each host thread has its own handle and workspace per device, as PyTorch keeps one per
// thread and stream.

// A cuBLASLt handle and its workspace for one device and host thread, with the chosen
// algorithm per problem. Created on the thread's first call and kept while it runs.
struct DeviceContext {
  cublasLtHandle_t handle = nullptr;
  Tensor workspace;  // (kWorkspaceBytes) u8 on the device
  std::map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>> algos;  // none: cuBLASLt has none

  DeviceContext() = default;
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;
  ~DeviceContext() {
    if (handle != nullptr) cublasLtDestroy(handle);
  }
};

DeviceContext& context(int device) {
  thread_local std::map<int, std::unique_ptr<DeviceContext>> contexts;
  std::unique_ptr<DeviceContext>& ctx = contexts[device];
  if (!ctx) {
    auto fresh = std::make_unique<DeviceContext>();
    check_cublas(cublasLtCreate(&fresh->handle), "cublasLtCreate");
    fresh->workspace =
        empty({static_cast<int64_t>(kWorkspaceBytes)}, {DType::u8, Device::cuda(device)});
    ctx = std::move(fresh);
  }
  return *ctx;
}

// One operand as cuBLASLt sees it: a column-major rows x cols matrix (per batch) with
// leading dimension ld, transposed when `trans`.
struct Operand {
  Tensor t;  // the tensor whose buffer is passed (a view with unit stride inside matrices)
  bool trans = false;
  int64_t rows = 0, cols = 0, ld = 0;
  int64_t batch_stride = 0;  // elements; 0 when shared by every batch
};

// The stride between consecutive matrices of x (..., R, C) when its batch dims collapse
// into one (false otherwise); 0 for a 2-D x, which every batch shares.
bool batch_stride_of(const Tensor& x, int64_t& stride) {
  stride = 0;
  int64_t expected = -1;  // stride the next-outer batch dim must have
  for (int64_t d = x.dim() - 3; d >= 0; --d) {
    if (x.size(d) == 1) continue;
    if (expected >= 0 && x.stride(d) != expected) return false;
    if (expected < 0) stride = x.stride(d);
    expected = x.stride(d) * x.size(d);
  }
  return true;
}

// Describes row-major x (..., R, C), used as op(x) when `trans`, as the column-major
// operand op(x)^T of Note [Row-major GEMM through column-major cuBLAS]. Copies only when
// the matrices are neither row- nor column-major or the batch dims do not collapse.
Operand column_major(const Tensor& x, bool trans) {
  const int64_t r = x.size(-2), c = x.size(-1);
  const int64_t s_r = x.stride(-2), s_c = x.stride(-1);
  int64_t batch_stride = 0;
  if (batch_stride_of(x, batch_stride)) {
    // Row-major (R, C) with leading dim s_r is column-major (C, R): op(x)^T needs `trans`.
    if (s_c == 1 && s_r >= std::max<int64_t>(c, 1)) return {x, trans, c, r, s_r, batch_stride};
    // Column-major (R, C) with leading dim s_c is x itself: op(x)^T needs the flip.
    if (s_r == 1 && s_c >= std::max<int64_t>(r, 1)) return {x, !trans, r, c, s_c, batch_stride};
  }
  const Tensor dense = x.detach().contiguous();  // a raw copy of the operand
  return {dense, trans, c, r, std::max<int64_t>(c, 1), x.dim() == 2 ? 0 : r * c};
}

cudaDataType_t data_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f64:
      return CUDA_R_64F;
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      TS_FAIL("[matmul] expected a floating dtype (f32, f64, f16, bf16), found ",
              dtype_name(dtype));
  }
}

// RAII owners of the cuBLASLt descriptors of one call.
struct Layout {
  cublasLtMatrixLayout_t desc = nullptr;
  Layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
         int64_t stride) {
    check_cublas(cublasLtMatrixLayoutCreate(&desc, type, rows, cols, ld),
                 "cublasLtMatrixLayoutCreate");
    if (batch > 1) {
      const int32_t count = static_cast<int32_t>(batch);
      check_cublas(cublasLtMatrixLayoutSetAttribute(desc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                    &count, sizeof(count)),
                   "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
      check_cublas(cublasLtMatrixLayoutSetAttribute(
                       desc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
                   "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
    }
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(desc); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

struct OpDesc {
  cublasLtMatmulDesc_t desc = nullptr;
  OpDesc(cublasComputeType_t compute, cudaDataType_t scale, bool trans_first, bool trans_second) {
    check_cublas(cublasLtMatmulDescCreate(&desc, compute, scale), "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = trans_first ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = trans_second ? CUBLAS_OP_T : CUBLAS_OP_N;
    check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
                 "cublasLtMatmulDescSetAttribute(TRANSA)");
    check_cublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
                 "cublasLtMatmulDescSetAttribute(TRANSB)");
  }
  ~OpDesc() { cublasLtMatmulDescDestroy(desc); }
  OpDesc(const OpDesc&) = delete;
  OpDesc& operator=(const OpDesc&) = delete;
};

// Note [Bias gradient epilogue]
// A linear layer's weight gradient g^T x (g: (R, N) output gradient, x: (R, K) input) is,
// transposed into cuBLASLt's column-major terms, D (K, N) = A (K, R) B (R, N), A being x's
// buffer as it is and B g's buffer transposed. The BGRADB epilogue also writes the sums of
// B over R, the bias gradient, while the GEMM reads g. That saves the separate pass over g
// (for GPT-2's c_fc, 100 MB per layer in bf16). The configuration is the one NVIDIA Apex's
// fused_dense uses for its weight gradient (csrc/fused_dense_cuda.cu in NVIDIA/apex: A not
// transposed, B transposed). Where cuBLASLt offers no algorithm with the epilogue, the GEMM and a
// sum run separately.

// Note [GELU epilogues]
// A GPT MLP's c_fc product is followed by GELU, and its backward multiplies c_proj's input
// gradient by GELU's derivative. cuBLASLt does both in the GEMMs' epilogues (the tanh
// approximation, as Tessera's gelu): GELU_AUX_BIAS adds the bias, writes GELU of the result
// to D and the result itself, GELU's input, to an auxiliary matrix of D's layout;
// DGELU_BGRAD multiplies the product by GELU's derivative at such an auxiliary input and
// also writes the sums of D's rows, the gradient of the bias that input included. For a row-
// major (R, N) result, D is column-major (N, R), so the auxiliary matrix is the row-major
// (R, N) pre-activation with leading dimension N (cuBLASLt wants it a multiple of 8) and
// the bias and its gradient have one entry per output feature. Saves a read and a write of
// the (R, 4C) activations in each direction. NVIDIA Apex's fused_dense
// (csrc/fused_dense_cuda.cu) and TransformerEngine's cublaslt_gemm.cu use these epilogues
// the same way. Where cuBLASLt offers no algorithm, the product and the elementwise kernels
// run separately.

// op(a) @ op(b) with the epilogue `epilogue`, whose vector is `vector` (the bias, or the
// bias gradient's (N) output; may be undefined for gelu_aux) and whose auxiliary matrix is
// `aux` (gelu_aux's output, dgelu_bias_grad's input: contiguous, of the result's shape);
// nothing when cuBLASLt has no algorithm for an epilogue that may_refuse(), or an aux
// epilogue would need a batched call. With `accumulate` (contiguous, the result's shape,
// a's dtype) the product is added into it (beta = 1) and it is the result. M, N, K and the
// batch are not 0 (the callers handle empty products).
std::optional<Tensor> gemm(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                           Epilogue epilogue, const Tensor& vector, const Tensor& aux = Tensor(),
                           const Tensor& accumulate = Tensor()) {
  // a: (..., M, K) or (..., K, M); b: (K, N) / (N, K) or batched like a.
  const int64_t m = trans_a ? a.size(-1) : a.size(-2);
  const int64_t n = trans_b ? b.size(-2) : b.size(-1);
  Shape out_shape(a.shape().begin(), a.shape().end() - 2);
  int64_t batch = 1;
  for (int64_t d : out_shape) batch *= d;
  out_shape.push_back(m);
  out_shape.push_back(n);
  set_device("matmul", a);

  // A 2-D b shared by a contiguous, untransposed a: one GEMM with batch * M rows.
  Tensor a2 = a;
  int64_t rows = m, gemm_batch = batch;
  if (b.dim() == 2 && a.dim() > 2 && !trans_a && a.is_contiguous()) {
    const int64_t k = a.size(-1);
    a2 = a.detach().reshape({batch * m, k});  // a raw view of the operand
    rows = batch * m;
    gemm_batch = 1;
  }
  const bool has_aux = epilogue == Epilogue::gelu_aux || epilogue == Epilogue::dgelu_bias_grad;
  if (has_aux && gemm_batch > 1) return std::nullopt;
  Tensor out = accumulate.defined() ? accumulate : empty(out_shape, {a.dtype(), a.device()});

  // Column-major: C^T (N, rows) = op(B)^T (N, K) x op(A)^T (K, rows); Note [Row-major GEMM
  // through column-major cuBLAS].
  const Operand first = column_major(b, trans_b);
  const Operand second = column_major(a2, trans_a);
  const cudaDataType_t type = data_type(a.dtype());
  const bool is_f64 = a.dtype() == DType::f64;
  const cublasComputeType_t compute = is_f64                    ? CUBLAS_COMPUTE_64F
                                      : a.dtype() == DType::f32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                : CUBLAS_COMPUTE_32F;
  const cudaDataType_t scale_type = is_f64 ? CUDA_R_64F : CUDA_R_32F;
  OpDesc op(compute, scale_type, first.trans, second.trans);
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  if (epilogue != Epilogue::none) {
    // The bias has one entry per row of column-major C^T: one per output feature n; so has
    // the bias gradient, op(a)'s sums over K (cuBLASLt's B is a's buffer), or D's sums.
    switch (epilogue) {
      case Epilogue::none:
      case Epilogue::bias:
        kind = CUBLASLT_EPILOGUE_BIAS;
        break;
      case Epilogue::bias_grad:
        kind = CUBLASLT_EPILOGUE_BGRADB;
        break;
      case Epilogue::gelu_aux:
        kind = vector.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        break;
      case Epilogue::dgelu_bias_grad:
        kind = CUBLASLT_EPILOGUE_DGELU_BGRAD;
        break;
    }
    check_cublas(
        cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &kind, sizeof(kind)),
        "cublasLtMatmulDescSetAttribute(EPILOGUE)");
    if (vector.defined()) {
      const void* vector_ptr = vector.raw_data();
      check_cublas(cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                  &vector_ptr, sizeof(vector_ptr)),
                   "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
    }
  }
  if (has_aux) {  // Note [GELU epilogues]
    const void* aux_ptr = aux.raw_data();
    const int64_t aux_ld = n;
    check_cublas(cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                &aux_ptr, sizeof(aux_ptr)),
                 "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_POINTER)");
    check_cublas(cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                &aux_ld, sizeof(aux_ld)),
                 "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_LD)");
    check_cublas(cublasLtMatmulDescSetAttribute(
                     op.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &type, sizeof(type)),
                 "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_DATA_TYPE)");
  }
  Layout la(type, first.rows, first.cols, first.ld, gemm_batch, first.batch_stride);
  Layout lb(type, second.rows, second.cols, second.ld, gemm_batch, second.batch_stride);
  Layout lc(type, n, rows, n, gemm_batch, gemm_batch > 1 ? n * m : 0);

  DeviceContext& ctx = context(a.device().index);
  const AlgoKey key{static_cast<int>(a.dtype()),
                    first.trans,
                    second.trans,
                    first.rows,
                    first.cols,
                    first.ld,
                    second.rows,
                    second.cols,
                    second.ld,
                    rows,
                    gemm_batch,
                    first.batch_stride,
                    second.batch_stride,
                    alignment_of(first.t.raw_data()),
                    alignment_of(second.t.raw_data()),
                    alignment_of(out.raw_data()),
                    static_cast<int>(kind)};
  auto it = ctx.algos.find(key);
  if (it == ctx.algos.end()) {
    cublasLtMatmulPreference_t pref = nullptr;
    check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const std::unique_ptr<cublasLtMatmulPreferenceOpaque_t,
                          decltype(&cublasLtMatmulPreferenceDestroy)>
        owned_pref(pref, &cublasLtMatmulPreferenceDestroy);
    auto prefer = [pref](cublasLtMatmulPreferenceAttributes_t attr, const auto& value) {
      check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)),
                   "cublasLtMatmulPreferenceSetAttribute");
    };
    const size_t ws = kWorkspaceBytes;
    const uint32_t align_a = std::get<13>(key), align_b = std::get<14>(key),
                   align_c = std::get<15>(key);
    prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        ctx.handle, op.desc, la.desc, lb.desc, lc.desc, lc.desc, pref, 1, &result, &found);
    // An epilogue cuBLASLt does not offer for these operands is a refusal (it may say so
    // with NOT_SUPPORTED or with no result), not an error.
    if (!may_refuse(epilogue) || status != CUBLAS_STATUS_NOT_SUPPORTED) {
      check_cublas(status, "cublasLtMatmulAlgoGetHeuristic");
    }
    std::optional<cublasLtMatmulAlgo_t> algo;
    if (status == CUBLAS_STATUS_SUCCESS && found > 0) algo = result.algo;
    TS_CHECK(algo || may_refuse(epilogue), "[matmul] cuBLASLt has no algorithm for ",
             dtype_name(a.dtype()), " ", shape_str(a.shape()), " x ", shape_str(b.shape()));
    it = ctx.algos.emplace(key, algo).first;
  }
  if (!it->second) return std::nullopt;
  const cublasLtMatmulAlgo_t algo = *it->second;
  const float one_f = 1.0f, zero_f = 0.0f;
  const double one_d = 1.0, zero_d = 0.0;
  const void* alpha = is_f64 ? static_cast<const void*>(&one_d) : &one_f;
  const bool add = accumulate.defined();
  const void* beta = is_f64 ? static_cast<const void*>(add ? &one_d : &zero_d)
                            : static_cast<const void*>(add ? &one_f : &zero_f);
  check_cublas(
      cublasLtMatmul(ctx.handle, op.desc, alpha, first.t.raw_data(), la.desc, second.t.raw_data(),
                     lb.desc, beta, out.raw_data(), lc.desc, out.raw_data(), lc.desc, &algo,
                     ctx.workspace.raw_data(), kWorkspaceBytes, kStream),
      "cublasLtMatmul");
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, const Tensor& bias) {
  const int64_t m = trans_a ? a.size(-1) : a.size(-2);
  const int64_t k = trans_a ? a.size(-2) : a.size(-1);
  const int64_t n = trans_b ? b.size(-2) : b.size(-1);
  Shape out_shape(a.shape().begin(), a.shape().end() - 2);
  const int64_t batch = numel_of(out_shape);
  out_shape.push_back(m);
  out_shape.push_back(n);
  if (m == 0 || n == 0 || batch == 0) return empty(out_shape, {a.dtype(), a.device()});
  if (k == 0) {
    const Tensor z = zeros(out_shape, {a.dtype(), a.device()});
    return bias.defined() ? cuda::binary(BinaryOp::add, z, bias) : z;
  }
  // The epilogue adds a contiguous, aligned bias in f32/f16/bf16 (Note [cuBLASLt alignment]).
  const bool fuse_bias = bias.defined() && a.dtype() != DType::f64 && bias.is_contiguous() &&
                         alignment_of(bias.raw_data()) >= kBiasAlignment;
  Tensor out = *gemm(a, b, trans_a, trans_b, fuse_bias ? Epilogue::bias : Epilogue::none, bias);
  if (bias.defined() && !fuse_bias) return cuda::binary(BinaryOp::add, out, bias);
  return out;
}

LinearParamGrads linear_param_grads(const Tensor& g, const Tensor& x) {
  // g: (R, N), x: (R, K) -> dweight (N, K) = g^T x, dbias (N); Note [Bias gradient epilogue].
  const int64_t rows = g.size(0), n = g.size(1), k = x.size(1);
  if (rows > 0 && n > 0 && k > 0 && (g.dtype() == DType::bf16 || g.dtype() == DType::f16)) {
    const Tensor dbias = empty({n}, {g.dtype(), g.device()});
    if (std::optional<Tensor> dweight = gemm(g, x, true, false, Epilogue::bias_grad, dbias)) {
      return {*dweight, dbias};
    }
  }
  return {cuda::matmul(g, x, true, false, Tensor()), cuda::sum(g, {0}, false)};
}

Tensor add_linear_param_grads(const Tensor& g, const Tensor& x, const Tensor& dweight,
                              bool with_bias) {
  // g: (R, N), x: (R, K); dweight (N, K) += g^T x; dbias (N) from BGRADB where it fits.
  const int64_t rows = g.size(0), n = g.size(1), k = x.size(1);
  if (rows == 0 || n == 0 || k == 0) {
    return with_bias ? cuda::sum(g, {0}, false) : Tensor();  // nothing to add
  }
  if (alignment_of(dweight.raw_data()) < 16) {
    // A flat buffer's view at an odd offset, which cuBLASLt may have no algorithm for:
    // the product into a new tensor, then added.
    cuda::axpy_(dweight, cuda::matmul(g, x, true, false, Tensor()), 1.0);
    return with_bias ? cuda::sum(g, {0}, false) : Tensor();
  }
  if (with_bias && (g.dtype() == DType::bf16 || g.dtype() == DType::f16)) {
    const Tensor dbias = empty({n}, {g.dtype(), g.device()});
    if (gemm(g, x, true, false, Epilogue::bias_grad, dbias, Tensor(), dweight)) return dbias;
  }
  gemm(g, x, true, false, Epilogue::none, Tensor(), Tensor(), dweight);
  return with_bias ? cuda::sum(g, {0}, false) : Tensor();
}

namespace {

// Whether 16-bit operands with an auxiliary matrix of `cols` columns at `aux` may take a
// GELU epilogue (Note [GELU epilogues]).
bool gelu_epilogue_fits(DType dtype, int64_t cols, const Tensor& aux) {
  return (dtype == DType::bf16 || dtype == DType::f16) && cols % 8 == 0 && aux.is_contiguous() &&
         alignment_of(aux.raw_data()) >= 16;
}

}  // namespace

LinearGelu linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  // x (R, K), weight (N, K) -> y, pre (R, N); Note [GELU epilogues].
  const int64_t rows = x.size(0), k = x.size(1), n = weight.size(0);
  if (rows > 0 && n > 0 && k > 0) {
    const Tensor pre = empty({rows, n}, {x.dtype(), x.device()});
    const bool bias_fits = !bias.defined() || (bias.is_contiguous() &&
                                               alignment_of(bias.raw_data()) >= kBiasAlignment);
    if (bias_fits && gelu_epilogue_fits(x.dtype(), n, pre)) {
      if (std::optional<Tensor> y = gemm(x, weight, false, true, Epilogue::gelu_aux, bias, pre)) {
        return {*y, pre};
      }
    }
  }
  const Tensor pre = cuda::matmul(x, weight, false, true, bias);
  return {cuda::unary(UnaryOp::gelu, pre), pre};
}

GeluInputGrads gelu_input_grads(const Tensor& g, const Tensor& weight, const Tensor& pre) {
  // g (R, N), weight (N, K), pre (R, K) -> dpre (R, K), dbias (K); Note [GELU epilogues].
  const int64_t rows = g.size(0), n = g.size(1), k = weight.size(1);
  if (rows > 0 && n > 0 && k > 0 && gelu_epilogue_fits(g.dtype(), k, pre)) {
    const Tensor dbias = empty({k}, {g.dtype(), g.device()});
    if (std::optional<Tensor> dpre =
            gemm(g, weight, false, false, Epilogue::dgelu_bias_grad, dbias, pre)) {
      return {*dpre, dbias};
    }
  }
  const Tensor dpre = cuda::unary_backward(
      UnaryOp::gelu, cuda::matmul(g, weight, false, false, Tensor()), pre, Tensor());
  return {dpre, cuda::sum(dpre, {0}, false)};
}

}  // namespace tessera::kernels::cuda
