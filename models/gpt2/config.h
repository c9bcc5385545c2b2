// GPT-2 family hyperparameters, presets and the `model` section of a run config.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/json.h"
#include "models/gpt2/moe_config.h"
#include "models/sparse/sparsity_config.h"

namespace tessera {

struct GptConfig {
  int64_t vocab_size = 50257;  // real tokens; the embedding is padded (padded_vocab_size)
  int64_t block_size = 1024;   // longest sequence (rows of the position embedding)
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  double dropout = 0.0;  // on embeddings, attention output and MLP output
  // On the attention probabilities (Hugging Face's attn_pdrop, Megatron's
  // --attention-dropout); unset: attention_probs_dropout() decides.
  std::optional<double> attention_dropout;
  bool bias = true;                 // biases in Linear and LayerNorm
  bool tie_word_embeddings = true;  // the LM head reuses transformer.wte.weight
  double layer_norm_eps = 1e-5;
  // Block-sparse attention (the run config's top-level "sparse_attention" section): every
  // block attends through this layout instead of dense causal attention. GPT is causal,
  // so the layout must be unidirectional (or dense).
  std::optional<SparsityConfig> sparse_attention;
  // Mixture-of-experts MLPs in some blocks (the model section's "moe": Note [GPT-MoE] in
  // models/gpt2/moe_config.h).
  std::optional<GptMoeConfig> moe;

  // vocab_size rounded up to a multiple of 128 (GEMM-friendly; padding rows are never
  // predicted: the loss and sampling use the first vocab_size logits only).
  int64_t padded_vocab_size() const { return (vocab_size + 127) / 128 * 128; }
  int64_t head_dim() const { return n_embd / n_head; }
  // The attention probabilities' dropout: attention_dropout when set, else `dropout` (one
  // rate for every dropout, as nanoGPT's and Hugging Face's defaults), except with block-sparse
  // attention, whose probabilities DeepSpeed's SparseSelfAttention never drops (0).
  double attention_probs_dropout() const;
  // Parameters with the padded vocabulary (what the model allocates), every expert counted.
  int64_t num_parameters() const;
  // Parameters one token's forward pass uses: an MoE block counts its gate, k experts and
  // its residual MLP (num_parameters() without MoE).
  int64_t active_parameters() const;
  // The experts' parameters: num_parameters() less the model's with no experts (0 without
  // MoE).
  int64_t expert_parameters() const;
  // Throws one line naming the first inconsistent field (n_embd % n_head, sizes <= 0, ...);
  // each message starts with `where` followed by the field name.
  void validate(const std::string& where = "[gpt2] ") const;

  // "gpt2" (124M), "gpt2-medium" (350M), "gpt2-large" (774M), "gpt2-xl" (1558M); throws
  // for any other name, listing the presets.
  static GptConfig preset(const std::string& name);
  // Reads the `model` section: {"type": "gpt2", "preset": name?, then any field above to
  // override; "sparse_attention" as an object, as to_json writes it}, checking each value's
  // type and range. Then it calls finish() on the section (read any extra keys first) and
  // validate().
  static GptConfig from_json(JsonObjectReader model);
  // The same fields as JSON (for checkpoint manifests and safetensors metadata).
  nlohmann::json to_json() const;
};

}  // namespace tessera
