// Causal attention through cuDNN's fused flash attention (Note [cuDNN fused attention] in
// kernels/fused_attention.h), and the CUDA entry points that pick it or Tessera's own
// kernels (kernels/cuda/attention_forward.cu, attention_backward.cu).
//
// Note [cuDNN attention graphs]
// The forward graph, with S = (B, H, T, T) virtual f32 and R = (B, H, T, 1):
//   S1 = q k^T; S2 = S1 * scale; keep = row >= col (GEN_INDEX on axes 2 and 3, CMP_GE);
//   S3 = keep ? S2 : -inf; M = max(S3); E = exp(S3 - M); Z = sum(E);
//   lse = M + log(Z); P = E / Z (16-bit); out = P v.
// The backward recomputes P from lse:
//   Di = rowsum(dout * out) (f32, in the workspace); S = scale q k^T - lse, masked;
//   P = exp(S); dv = P^T dout; dP = dout v^T; dS = P (dP - Di) scale;
//   dk = dS^T q; dq = dS k.
// With dropout (Note [Attention-probability dropout] in kernels/attention.h) both graphs read
// the mask M as a (B, H, T, T) tensor of ones and zeros in the operands' dtype, made by
// dropout_keep_mask before each call and freed after it, and s = 1 / (1 - p) by value:
// the forward's P becomes P * s * M before p v; the backward takes P * M * s into dv, and
//   dS = (dP * M - Di (1 - p)) * P * s * scale,
// which is P * (dP * M * s - Di) * scale. Di is always multiplied by a by-value factor, 1 - p
// with dropout and 1 without. These are cudnn-frontend's SDPA graphs with a custom dropout
// mask (its set_dropout(mask, scale) and, backward, set_dropout(mask, scale, scale_inv)),
// multiplications in its order, so the masks are Tessera's Philox, not cuDNN's RNG, and
// equal the flash kernels' and the unfused path's. Each call writes and reads the mask's
// 2 B H T T bytes (16-bit); cudnn-frontend says Blackwell's deterministic backward refuses
// dropout, which then falls back to the flash kernels like any graph cuDNN refuses.
//
// cuDNN takes k (and in the backward's dout v^T, v) as its transpose (B, H, D, T), the same
// bytes with the last two dims and strides swapped. dq is written by the matmul itself, not
// accumulated in f32 with atomics (cudnn-frontend's "deterministic algorithm"), so a backward gives
// the same bits run to run, as Tessera's own kernels do.
//
// q, k and v are read through their strides (views of the fused qkv projection); out is
// written in (B, T, H, D) order, so merging the heads afterwards is a view; dq, dk and dv
// are views of one (B, T, 3, H, D) buffer, the layout of the qkv projection's gradient.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "core/factories.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cudnn_graph.h"
#include "kernels/cuda/kernels.h"
#include "kernels/fused_attention.h"
#include "kernels/plan_cache.h"

namespace tessera::kernels::cuda {
namespace {

constexpr size_t kPlansPerThread = 64;  // see kernels/plan_cache.h
// The most workspace a plan may ask for: Tessera's kernels need none (O(T) scratch), and a
// plan that wants more at a long T falls back to them instead of running out of memory.
constexpr int64_t kMaxWorkspaceBytes = int64_t{1} << 30;

// Variant-pack uids of the graphs' non-virtual tensors.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kOut,
  kLse,
  kScale,
  kNegInf,
  kDout,
  kDq,
  kDk,
  kDv,
  kRowDot,  // Di of the backward, in the workspace
  kMask,    // the dropout mask, (B, H, T, T) of ones and zeros
  kDropScale,
  kRowDotScale,  // what Di is multiplied by: 1 - p (1 without dropout)
};

// A built plan, or why cuDNN could not build one (then Tessera's kernels run).
struct CachedPlan {
  std::unique_ptr<cudnn::Plan> plan;
  std::string why_not;
};

// A cuDNN handle, destroyed after the plans built on it (declared before them).
struct Handle {
  cudnnHandle_t get = nullptr;
  Handle() = default;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() {
    if (get != nullptr) cudnnDestroy(get);
  }
};

// Note [cuBLASLt per thread] (kernels/cuda/matmul.cu) holds for cuDNN's handle too: each
// host thread has its own per device, with the plans it built.
struct CudnnContext {
  Handle handle;
  std::string unavailable;  // why cudnnCreate failed; then only the flash kernels run
  FusedAttentionMachine machine;
  PlanCache<CachedPlan> plans{kPlansPerThread};
};

CudnnContext& context(const char* op, int device) {
  thread_local std::map<int, std::unique_ptr<CudnnContext>> contexts;
  std::unique_ptr<CudnnContext>& ctx = contexts[device];
  if (!ctx) {
    auto fresh = std::make_unique<CudnnContext>();
    if (const cudnnStatus_t s = cudnnCreate(&fresh->handle.get); s != CUDNN_STATUS_SUCCESS) {
      fresh->unavailable = std::string("cudnnCreate failed: ") + cudnnGetErrorString(s);
    }
    check_cuda(
        cudaDeviceGetAttribute(&fresh->machine.sm_major, cudaDevAttrComputeCapabilityMajor, device),
        op, "cudaDeviceGetAttribute");
    check_cuda(
        cudaDeviceGetAttribute(&fresh->machine.sm_minor, cudaDevAttrComputeCapabilityMinor, device),
        op, "cudaDeviceGetAttribute");
    fresh->machine.cudnn_version = static_cast<int64_t>(cudnnGetVersion());
    const char* switch_value = std::getenv("TESSERA_CUDNN_ATTENTION");
    fresh->machine.turned_off = switch_value != nullptr && std::string(switch_value) == "0";
    ctx = std::move(fresh);
  }
  return *ctx;
}

cudnnDataType_t io_type(DType dtype) {
  return dtype == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
}

std::vector<int64_t> dims_of(const Tensor& t) {
  return {t.size(0), t.size(1), t.size(2), t.size(3)};
}
std::vector<int64_t> strides_of(const Tensor& t) {
  return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

// t (B, H, T, D) declared as its transpose (B, H, D, T): the same bytes.
cudnn::TensorSpec transposed(int64_t uid, const Tensor& t) {
  return {uid,
          io_type(t.dtype()),
          {t.size(0), t.size(1), t.size(3), t.size(2)},
          {t.stride(0), t.stride(1), t.stride(3), t.stride(2)}};
}

cudnn::TensorSpec as_is(int64_t uid, const Tensor& t) {
  return {uid, io_type(t.dtype()), dims_of(t), strides_of(t)};
}

cudnn::TensorSpec scalar(int64_t uid) {
  return {uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, /*by_value=*/true};
}

// The key of a plan: direction, dropout or not, dtype, sizes and every operand's strides.
PlanCache<CachedPlan>::Key key_of(int64_t direction, bool dropout,
                                  const std::vector<Tensor>& operands) {
  PlanCache<CachedPlan>::Key key{direction, dropout ? 1 : 0,
                                 static_cast<int64_t>(operands[0].dtype())};
  for (int64_t d = 0; d < 4; ++d) key.push_back(operands[0].size(d));
  for (const Tensor& t : operands) {
    for (int64_t d = 0; d < 4; ++d) key.push_back(t.stride(d));
  }
  return key;
}

// The causal mask of Note [cuDNN attention graphs]: `scores` where row >= col, else -inf.
const cudnn::Descriptor* causal_mask(cudnn::GraphBuilder& g, const cudnn::Descriptor* scores,
                                     const std::vector<int64_t>& sdims,
                                     const std::vector<int64_t>& sstrides) {
  const cudnn::Descriptor* row = g.virtual_tensor(sdims, sstrides, CUDNN_DATA_INT32);
  const cudnn::Descriptor* col = g.virtual_tensor(sdims, sstrides, CUDNN_DATA_INT32);
  const cudnn::Descriptor* keep = g.virtual_tensor(sdims, sstrides, CUDNN_DATA_BOOLEAN);
  const cudnn::Descriptor* masked = g.virtual_tensor(sdims, sstrides);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, row, CUDNN_DATA_FLOAT, nullptr, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, nullptr, col, CUDNN_DATA_FLOAT, nullptr, 3);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores, g.tensor(scalar(kNegInf)), masked,
              CUDNN_DATA_FLOAT, keep);
  return masked;
}

// The mask operand of the graphs with dropout: (B, H, T, T), contiguous, the io type.
cudnn::TensorSpec mask_spec(const Tensor& q) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2);
  return {kMask, io_type(q.dtype()), {b, h, t, t}, {h * t * t, t * t, t, 1}};
}

// The dropout operands of one graph, each declared once (null without dropout).
struct DropoutOperands {
  const cudnn::Descriptor* mask = nullptr;   // M
  const cudnn::Descriptor* scale = nullptr;  // s = 1 / (1 - p), by value

  DropoutOperands(cudnn::GraphBuilder& g, const Tensor& q, bool dropout) {
    if (!dropout) return;
    mask = g.tensor(mask_spec(q));
    scale = g.tensor(scalar(kDropScale));
  }
};

// A virtual (B, H, T, T) tensor of `type` holding x * y.
const cudnn::Descriptor* product(cudnn::GraphBuilder& g, const cudnn::Descriptor* x,
                                 const cudnn::Descriptor* y, const std::vector<int64_t>& sdims,
                                 const std::vector<int64_t>& sstrides,
                                 cudnnDataType_t type = CUDNN_DATA_FLOAT) {
  const cudnn::Descriptor* result = g.virtual_tensor(sdims, sstrides, type);
  g.pointwise(CUDNN_POINTWISE_MUL, x, y, result);
  return result;
}

CachedPlan build_forward(const char* op, CudnnContext& ctx, const Tensor& q, const Tensor& k,
                         const Tensor& v, const Tensor& out, bool dropout) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2);
  const std::vector<int64_t> sdims{b, h, t, t}, sstrides{h * t * t, t * t, t, 1};
  const std::vector<int64_t> rdims{b, h, t, 1}, rstrides{h * t, t, 1, 1};
  cudnn::GraphBuilder g(op);
  const cudnn::Descriptor* s1 = g.virtual_tensor(sdims, sstrides);
  g.matmul(g.tensor(as_is(kQ, q)), g.tensor(transposed(kK, k)), s1);
  const cudnn::Descriptor* s2 = g.virtual_tensor(sdims, sstrides);
  g.pointwise(CUDNN_POINTWISE_MUL, s1, g.tensor(scalar(kScale)), s2);
  const cudnn::Descriptor* s3 = causal_mask(g, s2, sdims, sstrides);
  const cudnn::Descriptor* row_max = g.virtual_tensor(rdims, rstrides);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s3, row_max, ctx.machine.cudnn_version);
  const cudnn::Descriptor* shifted = g.virtual_tensor(sdims, sstrides);
  g.pointwise(CUDNN_POINTWISE_SUB, s3, row_max, shifted);
  const cudnn::Descriptor* e = g.virtual_tensor(sdims, sstrides);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, e);
  const cudnn::Descriptor* z = g.virtual_tensor(rdims, rstrides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z, ctx.machine.cudnn_version);
  const cudnn::Descriptor* log_z = g.virtual_tensor(rdims, rstrides);
  g.pointwise(CUDNN_POINTWISE_LOG, z, nullptr, log_z);
  g.pointwise(CUDNN_POINTWISE_ADD, row_max, log_z,
              g.tensor({kLse, CUDNN_DATA_FLOAT, rdims, rstrides}));
  const cudnn::Descriptor* p =
      g.virtual_tensor(sdims, sstrides, dropout ? CUDNN_DATA_FLOAT : io_type(q.dtype()));
  g.pointwise(CUDNN_POINTWISE_DIV, e, z, p);
  if (dropout) {  // P * s * M, in cudnn-frontend's order
    const DropoutOperands drop(g, q, true);
    p = product(g, product(g, p, drop.scale, sdims, sstrides), drop.mask, sdims, sstrides,
                io_type(q.dtype()));
  }
  g.matmul(p, g.tensor(as_is(kV, v)), g.tensor(as_is(kOut, out)));
  CachedPlan cached;
  cached.plan = g.build(ctx.handle.get, cached.why_not);
  return cached;
}

CachedPlan build_backward(const char* op, CudnnContext& ctx, const Tensor& dout, const Tensor& q,
                          const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dq,
                          const Tensor& dk, const Tensor& dv, bool dropout) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  const cudnnDataType_t io = io_type(q.dtype());
  const std::vector<int64_t> sdims{b, h, t, t}, sstrides{h * t * t, t * t, t, 1};
  const std::vector<int64_t> sstrides_t{h * t * t, t * t, 1, t};  // the transposed view
  const std::vector<int64_t> rdims{b, h, t, 1}, rstrides{h * t, t, 1, 1};
  cudnn::GraphBuilder g(op);
  const cudnn::Descriptor* q_desc = g.tensor(as_is(kQ, q));
  const cudnn::Descriptor* k_t = g.tensor(transposed(kK, k));
  const cudnn::Descriptor* dout_desc = g.tensor(as_is(kDout, dout));
  const cudnn::Descriptor* scale = g.tensor(scalar(kScale));
  const DropoutOperands drop(g, q, dropout);

  // Di = rowsum(dout * out) (times 1 - p with dropout), kept in the workspace.
  const cudnn::Descriptor* products = g.virtual_tensor({b, h, t, d}, {h * t * d, t * d, d, 1});
  g.pointwise(CUDNN_POINTWISE_MUL, dout_desc, g.tensor(as_is(kOut, out)), products);
  const cudnn::Descriptor* sums = g.virtual_tensor(rdims, rstrides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, products, sums, ctx.machine.cudnn_version);
  const cudnn::Descriptor* row_dot = g.tensor({kRowDot, CUDNN_DATA_FLOAT, rdims, rstrides});
  g.pointwise(CUDNN_POINTWISE_MUL, sums, g.tensor(scalar(kRowDotScale)), row_dot);

  // P = exp(scale q k^T - lse), masked.
  const cudnn::Descriptor* s = g.virtual_tensor(sdims, sstrides);
  g.matmul(q_desc, k_t, s);
  const cudnn::Descriptor* scaled = g.virtual_tensor(sdims, sstrides);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, scaled);
  const cudnn::Descriptor* centred = g.virtual_tensor(sdims, sstrides);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, g.tensor({kLse, CUDNN_DATA_FLOAT, rdims, rstrides}),
              centred);
  const cudnn::Descriptor* masked = causal_mask(g, centred, sdims, sstrides);
  const cudnn::Descriptor* p = g.virtual_tensor(sdims, sstrides);
  g.pointwise(CUDNN_POINTWISE_EXP, masked, nullptr, p);

  // dv = P^T dout, P dropped out with dropout.
  const cudnn::Descriptor* p_used =  // P * M * s, in cudnn-frontend's order
      dropout ? product(g, product(g, p, drop.mask, sdims, sstrides), drop.scale, sdims, sstrides)
              : p;
  const cudnn::Descriptor* p_t = g.virtual_tensor(sdims, sstrides_t, io);
  g.reshape(p_used, p_t);
  g.matmul(p_t, dout_desc, g.tensor(as_is(kDv, dv)));

  // dS = P (dout v^T - Di) scale; with dropout P (dout v^T M - Di (1 - p)) s scale.
  const cudnn::Descriptor* dp = g.virtual_tensor(sdims, sstrides);
  g.matmul(dout_desc, g.tensor(transposed(kV, v)), dp);
  if (dropout) dp = product(g, dp, drop.mask, sdims, sstrides);
  const cudnn::Descriptor* dp_centred = g.virtual_tensor(sdims, sstrides);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, row_dot, dp_centred);
  const cudnn::Descriptor* dp_p = g.virtual_tensor(sdims, sstrides);
  g.pointwise(CUDNN_POINTWISE_MUL, dp_centred, p, dp_p);
  if (dropout) dp_p = product(g, dp_p, drop.scale, sdims, sstrides);
  const cudnn::Descriptor* ds = g.virtual_tensor(sdims, sstrides);
  g.pointwise(CUDNN_POINTWISE_MUL, dp_p, scale, ds);

  // dk = dS^T q; dq = dS k (k seen again as (B, H, T, D)).
  const cudnn::Descriptor* ds_t = g.virtual_tensor(sdims, sstrides_t, io);
  g.reshape(ds, ds_t);
  g.matmul(ds_t, q_desc, g.tensor(as_is(kDk, dk)));
  const cudnn::Descriptor* k_again = g.virtual_tensor(dims_of(k), strides_of(k));
  g.reshape(k_t, k_again);
  g.matmul(ds, k_again, g.tensor(as_is(kDq, dq)));
  CachedPlan cached;
  cached.plan = g.build(ctx.handle.get, cached.why_not);
  return cached;
}

// The cached plan for `key`, built by `build` on first use. A graph cuDNN refuses, at any
// step of building it, and a plan whose workspace is over kMaxWorkspaceBytes are refusals:
// said once (a warning naming the shape) and remembered, so that key runs the flash kernels.
template <class Build>
const CachedPlan& plan_for(const char* op, CudnnContext& ctx, const PlanCache<CachedPlan>::Key& key,
                           const Tensor& q, Build&& build) {
  if (CachedPlan* found = ctx.plans.find(key)) return *found;
  CachedPlan built;
  try {
    built = build();
  } catch (const Error& e) {
    built = CachedPlan{nullptr, e.what()};
  }
  if (built.plan && built.plan->workspace_bytes() > kMaxWorkspaceBytes) {
    built.why_not = "its plan wants a workspace of " +
                    std::to_string(built.plan->workspace_bytes() >> 20) + " MiB, over " +
                    std::to_string(kMaxWorkspaceBytes >> 20) + " MiB";
    built.plan.reset();
  }
  if (!built.plan) {
    std::fprintf(stderr, "[%s] cuDNN's fused attention is not used for (B, H, T, D) = %s %s: %s\n",
                 op, shape_str(q.shape()).c_str(), std::string(dtype_name(q.dtype())).c_str(),
                 built.why_not.c_str());
  }
  return ctx.plans.insert(key, std::move(built));
}

// Bytes rounded up to a multiple of 256 (the workspace's regions).
int64_t round_up(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// The variant pack's dropout entries, kMask and kDropScale (none without dropout): the
// mask of q's (B, H, T, T) probabilities in q's dtype, made here, and s = 1 / (1 - p).
class DropoutValues {
 public:
  DropoutValues(const Tensor& q, const AttentionDropout& dropout)
      : scale_(static_cast<float>(1.0 / (1.0 - dropout.p))) {
    if (!dropout.drops()) return;
    const int64_t t = q.size(2);
    mask_ = dropout_keep_mask({q.size(0), q.size(1), t, t}, q.dtype(), q.device(), dropout.p,
                              dropout.seed, dropout.offset);
  }
  // Appends the entries; they point into this object, which must outlive the execution.
  void append_to(std::vector<int64_t>& uids, std::vector<void*>& pointers) {
    if (!mask_.defined()) return;
    uids.insert(uids.end(), {kMask, kDropScale});
    pointers.insert(pointers.end(), {mask_.raw_data(), &scale_});
  }

 private:
  Tensor mask_;  // (B, H, T, T), undefined without dropout
  float scale_;
};

}  // namespace

std::optional<AttentionOutput> cudnn_causal_attention(const Tensor& q_in, const Tensor& k_in,
                                                      const Tensor& v_in, double scale,
                                                      const AttentionDropout& dropout) {
  constexpr const char* op = "causal_attention (cuDNN)";
  const Tensor q = q_in.detach(), k = k_in.detach(), v = v_in.detach();
  if (q.dtype() != DType::bf16 && q.dtype() != DType::f16) return std::nullopt;
  set_device(op, q);
  CudnnContext& ctx = context(op, q.device().index);
  if (!ctx.unavailable.empty() ||
      !fused_attention_refusal({q, k, v}, Tensor(), ctx.machine, dropout).empty()) {
    return std::nullopt;
  }
  const bool drops = dropout.drops();
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  // (B, T, H, D) in memory, seen as (B, H, T, D).
  const Tensor out = empty({b, t, h, d}, {q.dtype(), q.device()}).transpose(1, 2);
  const Tensor lse = empty({b, h, t}, {DType::f32, q.device()});  // (B, H, T)
  const CachedPlan& cached = plan_for(op, ctx, key_of(0, drops, {q, k, v}), q,
                                      [&] { return build_forward(op, ctx, q, k, v, out, drops); });
  if (!cached.plan) return std::nullopt;
  const Tensor workspace =
      empty({std::max<int64_t>(cached.plan->workspace_bytes(), 1)}, {DType::u8, q.device()});
  DropoutValues drop(q, dropout);
  float scale_value = static_cast<float>(scale);
  float neg_inf = -INFINITY;
  std::vector<int64_t> uids{kQ, kK, kV, kOut, kLse, kScale, kNegInf};
  std::vector<void*> pointers{q.raw_data(),   k.raw_data(), v.raw_data(), out.raw_data(),
                              lse.raw_data(), &scale_value, &neg_inf};
  drop.append_to(uids, pointers);
  cached.plan->execute(ctx.handle.get, uids, pointers, workspace.raw_data(), op);
  return AttentionOutput{out, lse};
}

std::optional<AttentionGrads> cudnn_causal_attention_backward(
    const Tensor& dout_in, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
    const Tensor& out_in, const Tensor& lse_in, double scale, const AttentionDropout& dropout) {
  constexpr const char* op = "causal_attention_backward (cuDNN)";
  const Tensor dout = dout_in.detach(), q = q_in.detach(), k = k_in.detach(), v = v_in.detach(),
               out = out_in.detach(), lse = lse_in.detach();
  if (q.dtype() != DType::bf16 && q.dtype() != DType::f16) return std::nullopt;
  set_device(op, q);
  CudnnContext& ctx = context(op, q.device().index);
  if (!ctx.unavailable.empty() ||
      !fused_attention_refusal({q, k, v, out, dout}, lse, ctx.machine, dropout).empty()) {
    return std::nullopt;
  }
  const bool drops = dropout.drops();
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3);
  // (B, T, 3, H, D) in memory: dq, dk and dv are its three (B, H, T, D) views.
  const Tensor grads = empty({b, t, 3, h, d}, {q.dtype(), q.device()});
  const Tensor dq = grads.select(2, 0).transpose(1, 2);
  const Tensor dk = grads.select(2, 1).transpose(1, 2);
  const Tensor dv = grads.select(2, 2).transpose(1, 2);
  const CachedPlan& cached = plan_for(op, ctx, key_of(1, drops, {q, k, v, out, dout}), q, [&] {
    return build_backward(op, ctx, dout, q, k, v, out, dq, dk, dv, drops);
  });
  if (!cached.plan) return std::nullopt;
  const int64_t row_dot_bytes = round_up(b * h * t * static_cast<int64_t>(sizeof(float)));
  const Tensor workspace =
      empty({row_dot_bytes + cached.plan->workspace_bytes()}, {DType::u8, q.device()});
  char* base = static_cast<char*>(workspace.raw_data());
  DropoutValues drop(q, dropout);
  float scale_value = static_cast<float>(scale);
  float neg_inf = -INFINITY;
  float row_dot_scale = static_cast<float>(1.0 - dropout.p);
  std::vector<int64_t> uids{kQ,  kK,  kV,      kOut,   kLse,    kDout,       kDq,
                            kDk, kDv, kRowDot, kScale, kNegInf, kRowDotScale};
  std::vector<void*> pointers{
      q.raw_data(),    k.raw_data(),  v.raw_data(),  out.raw_data(), lse.raw_data(),
      dout.raw_data(), dq.raw_data(), dk.raw_data(), dv.raw_data(),  base,
      &scale_value,    &neg_inf,      &row_dot_scale};
  drop.append_to(uids, pointers);
  cached.plan->execute(ctx.handle.get, uids, pointers, base + row_dot_bytes, op);
  return AttentionGrads{dq, dk, dv};
}

AttentionOutput causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                 const AttentionDropout& dropout) {
  if (std::optional<AttentionOutput> fused = cudnn_causal_attention(q, k, v, scale, dropout)) {
    return *std::move(fused);
  }
  return flash_causal_attention(q, k, v, scale, dropout);
}

AttentionGrads causal_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& out, const Tensor& lse,
                                         double scale, const AttentionDropout& dropout) {
  if (std::optional<AttentionGrads> fused =
          cudnn_causal_attention_backward(dout, q, k, v, out, lse, scale, dropout)) {
    return *std::move(fused);
  }
  return flash_causal_attention_backward(dout, q, k, v, out, lse, scale, dropout);
}

}  // namespace tessera::kernels::cuda
