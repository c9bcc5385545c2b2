// BERT encoder hyperparameters and the `model` section of a run config.
#pragma once

#include <cstdint>
#include <string>

#include "core/json.h"

namespace tessera {

// Note [BERT vocabulary]
// vocab_size counts the tokenizer's real tokens, ids [0, vocab_size). The model adds one
// [MASK] token with id vocab_size (masked-LM inputs only; it is never a target), so the
// word embedding has vocab_size + 1 rows, padded up to a multiple of 128 for the GEMMs.
// The loss and any prediction use the first vocab_size logits only.
struct BertConfig {
  int64_t vocab_size = 30522;  // real tokens (bert-base-uncased's WordPiece vocabulary)
  int64_t block_size = 512;    // longest sequence (rows of the position embedding)
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  int64_t intermediate_size = 0;  // MLP hidden width; 0 means 4 * n_embd
  double dropout = 0.1;           // on embeddings, attention output and MLP output
  double layer_norm_eps = 1e-12;  // BERT's value
  double mask_prob = 0.15;        // share of positions selected for the masked-LM loss

  // The [MASK] token's id (Note [BERT vocabulary]).
  int64_t mask_token_id() const { return vocab_size; }
  // vocab_size + 1 ([MASK]) rounded up to a multiple of 128: the embedding's rows.
  int64_t padded_vocab_size() const { return (vocab_size + 1 + 127) / 128 * 128; }
  int64_t head_dim() const { return n_embd / n_head; }
  // intermediate_size with 0 resolved to 4 * n_embd.
  int64_t intermediate_dim() const {
    return intermediate_size > 0 ? intermediate_size : 4 * n_embd;
  }
  // Parameters with the padded vocabulary (what the model allocates).
  int64_t num_parameters() const;
  // Throws one line naming the first inconsistent field (n_embd % n_head, sizes <= 0, ...);
  // each message starts with `where` followed by the field name.
  void validate(const std::string& where = "[bert] ") const;

  // Reads the `model` section: {"type": "bert", then any field above to override},
  // checking each value's type and range ("intermediate_size": 0 means 4 * n_embd). Then
  // it calls finish() on the section (read any extra keys first) and validate().
  static BertConfig from_json(JsonObjectReader model);
  // The same fields as JSON, intermediate_size resolved (for checkpoint manifests and
  // safetensors metadata).
  nlohmann::json to_json() const;
};

}  // namespace tessera
