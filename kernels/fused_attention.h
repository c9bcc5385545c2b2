// When cuDNN's fused attention takes a causal attention call, decided on the host from the
// operands' dtypes, shapes, strides and addresses and from the machine, so that the rules
// are tested without a GPU (tests/kernels/fused_attention_test.cc). The CUDA attention
// (kernels/cuda/cudnn_attention.cu) asks before it builds a cuDNN plan and runs Tessera's
// own kernels (kernels/cuda/attention_forward.cu) for every call refused here.
//
// Note [cuDNN fused attention]
// cuDNN 9 fuses scaled dot-product attention when it is given the whole computation as one
// operation graph: q k^T, the scale, the causal mask (row and column indices, a comparison
// and a select of -inf), the softmax with its log-sum-exp kept for the backward, and p v.
// Its runtime-fusion engine recognises that pattern and compiles one flash-attention kernel
// for it (the graph cudnn-frontend's SDPA node builds: include/cudnn_frontend/node/
// scaled_dot_product_flash_attention.h in NVIDIA/cudnn-frontend). The limits below are a
// conservative subset of the ones that project checks before building that graph
// (include/cudnn_frontend/node/sdpa_support_surface.h; it allows D up to 256 on Hopper):
// 16-bit operands, a head dim that is a multiple of 8 and at most
// 128, compute capability 8.0 or newer, the last dim contiguous; cuDNN 9.10.0 and 9.10.1
// are refused for known bugs; a backward on cuDNN 9.15 or older needs T to be a multiple
// of 128 (older engines pad otherwise) and any backward needs T > 1. Every operand is
// declared 16-byte aligned, so its address and its outer strides must be. With dropout the
// graph reads a (B, H, T, T) mask in the operands' dtype (Note [cuDNN attention graphs] in
// kernels/cuda/cudnn_attention.cu), refused over kMaxDropoutMaskBytes.
// TESSERA_CUDNN_ATTENTION=0 turns it off (see FusedAttentionMachine::turned_off).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/attention.h"

namespace tessera::kernels {

// The largest dropout mask cuDNN's graphs are given; past it the flash kernels, which make
// their masks in their tiles, take the call.
constexpr int64_t kMaxDropoutMaskBytes = int64_t{1} << 30;

// What cuDNN's fused attention depends on in the machine.
struct FusedAttentionMachine {
  int sm_major = 0;           // compute capability of the device
  int sm_minor = 0;           //
  int64_t cudnn_version = 0;  // cudnnGetVersion(): 91900 for 9.19.0
  // TESSERA_CUDNN_ATTENTION=0 in the environment when the host thread first ran attention
  // on the device: every call runs Tessera's flash kernels, which keep the probabilities and
  // their gradients in f32 where cuDNN rounds them to 16 bits before the p v, p^T dout and
  // dS^T q products (as FlashAttention does).
  bool turned_off = false;
};

// Empty when cuDNN's fused attention takes the call, else why not (one line). `operands`
// holds q, k, v (B, H, T, D) and, for the backward, out and dout of the same shape; `lse`
// is the backward's (B, H, T) log-sum-exp, undefined for the forward; `dropout` the
// probabilities' (kernels/attention.h).
std::string fused_attention_refusal(const std::vector<Tensor>& operands, const Tensor& lse,
                                    const FusedAttentionMachine& machine,
                                    const AttentionDropout& dropout = {});

}  // namespace tessera::kernels
