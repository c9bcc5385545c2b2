// The rules of Note [cuDNN fused attention].
#include "kernels/fused_attention.h"

#include <cstdint>

#include "core/error.h"
#include "core/shape.h"

namespace tessera::kernels {
namespace {

constexpr int64_t kAlignmentBytes = 16;
constexpr int64_t kMaxHeadDim = 128;

// cudnnGetVersion()'s number as major.minor.patch: 9.x is 10000 major + 100 minor + patch,
// 8.x was 1000 major + 100 minor + patch.
std::string version_str(int64_t v) {
  if (v < 90000) {
    return std::to_string(v / 1000) + "." + std::to_string(v / 100 % 10) + "." +
           std::to_string(v % 100);
  }
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

// Why `t` cannot be declared 16-byte aligned with a contiguous last dim, or empty.
std::string layout_refusal(const char* name, const Tensor& t) {
  if (t.stride(-1) != 1) {
    return std::string(name) + "'s last dim has stride " + std::to_string(t.stride(-1)) + ", not 1";
  }
  const int64_t per_vector = kAlignmentBytes / static_cast<int64_t>(itemsize(t.dtype()));
  for (int64_t d = 0; d + 1 < t.dim(); ++d) {
    if (t.size(d) > 1 && t.stride(d) % per_vector != 0) {
      return std::string(name) + "'s stride " + std::to_string(t.stride(d)) + " of dim " +
             std::to_string(d) + " is not a multiple of 16 bytes";
    }
  }
  if (reinterpret_cast<uintptr_t>(t.raw_data()) % kAlignmentBytes != 0) {
    return std::string(name) + " is not 16-byte aligned";
  }
  return "";
}

}  // namespace

std::string fused_attention_refusal(const std::vector<Tensor>& operands, const Tensor& lse,
                                    const FusedAttentionMachine& machine,
                                    const AttentionDropout& dropout) {
  TS_CHECK(operands.size() == 3 || operands.size() == 5,
           "[fused_attention_refusal] expected q, k, v (and out, dout for the backward), found ",
           operands.size(), " operands");
  const bool backward = operands.size() == 5;
  if (machine.turned_off) return "turned off by TESSERA_CUDNN_ATTENTION=0";
  const Tensor& q = operands[0];
  if (q.dtype() != DType::bf16 && q.dtype() != DType::f16) {
    return "cuDNN fuses bf16 and f16 attention, found " + std::string(dtype_name(q.dtype()));
  }
  if (machine.sm_major < 8) {
    return "cuDNN's fused attention needs compute capability 8.0, found " +
           std::to_string(machine.sm_major) + "." + std::to_string(machine.sm_minor);
  }
  if (machine.cudnn_version < 90000) {
    return "cuDNN's fused attention needs cuDNN 9, found " + version_str(machine.cudnn_version);
  }
  if (machine.cudnn_version == 91000 || machine.cudnn_version == 91001) {
    return "cuDNN " + version_str(machine.cudnn_version) +
           " has known bugs in fused attention (refused by cudnn-frontend too)";
  }
  const int64_t len = q.size(2), dim = q.size(3);
  if (dim % 8 != 0 || dim > kMaxHeadDim) {
    return "cuDNN's fused attention needs a head dim that is a multiple of 8 and at most " +
           std::to_string(kMaxHeadDim) + ", found " + std::to_string(dim);
  }
  if (q.numel() == 0) return "empty attention";
  if (backward && len < 2) return "cuDNN's fused attention backward needs T > 1, found 1";
  if (backward && machine.cudnn_version <= 91500 && len % 128 != 0) {
    return "cuDNN " + version_str(machine.cudnn_version) +
           "'s fused attention backward needs T to be a multiple of 128, found " +
           std::to_string(len);
  }
  const char* names[] = {"q", "k", "v", "out", "dout"};
  for (size_t i = 0; i < operands.size(); ++i) {
    const std::string why = layout_refusal(names[i], operands[i]);
    if (!why.empty()) return why;
  }
  if (backward && !lse.is_contiguous()) return "lse is not contiguous";
  if (backward && reinterpret_cast<uintptr_t>(lse.raw_data()) % kAlignmentBytes != 0) {
    return "lse is not 16-byte aligned";
  }
  const int64_t mask_bytes = q.size(0) * q.size(1) * len * len * itemsize(q.dtype());
  if (dropout.drops() && mask_bytes > kMaxDropoutMaskBytes) {
    return "its dropout mask would take " + std::to_string(mask_bytes >> 20) + " MiB, over " +
           std::to_string(kMaxDropoutMaskBytes >> 20) + " MiB";
  }
  return "";
}

}  // namespace tessera::kernels
