// llm.c GPT-2 checkpoints (gpt2_124M.bin, gpt2_124M_bf16.bin) <-> Tessera's state dict.
//
// Format (little-endian): int32 header[256] with [0] = 20240326 (magic), [1] = 3 (fp32) or
// 5 (bf16), [2] = max_seq_len, [3] = vocab_size, [4] = num_layers, [5] = num_heads,
// [6] = channels, [7] = padded_vocab_size; then 16 arrays in this order: wte (Vp, C),
// wpe (maxT, C), ln1w (L, C), ln1b (L, C), qkvw (L, 3C, C), qkvb (L, 3C), attprojw
// (L, C, C), attprojb (L, C), ln2w (L, C), ln2b (L, C), fcw (L, 4C, C), fcb (L, 4C),
// fcprojw (L, C, 4C), fcprojb (L, C), lnfw (C), lnfb (C). Weights are already (out, in),
// Tessera's layout; the per-layer arrays are split into transformer.h.{i}.* tensors.
// The file size must match the header exactly.
#pragma once

#include <string>

#include "autograd/module.h"
#include "models/gpt2/config.h"

namespace tessera {

struct LlmcCheckpoint {
  GptConfig config;  // bias and tied embeddings, as llm.c's GPT-2 has
  StateDict state;   // f32 CPU tensors named as gpt_parameter_shapes(config)
};

// Reads and validates a checkpoint (magic, version, positive sizes, channels % heads,
// padded_vocab_size >= vocab_size, exact file size). bf16 files (version 5) are converted
// to f32. The state's wte has config.padded_vocab_size() rows: when the file's
// padded_vocab_size (header[7]) differs, rows [0, vocab_size) are kept and the rest are
// zero (the padding rows are never predicted). Errors name the file, the field, what was
// expected and what was found.
LlmcCheckpoint read_llmc_checkpoint(const std::string& path);

// Writes `state` (checked as check_gpt_state_dict does) as an fp32 (version 3) checkpoint
// with header[7] = cfg.padded_vocab_size(), atomically. Needs cfg.bias and
// cfg.tie_word_embeddings (the format has no other kind of GPT-2).
void write_llmc_checkpoint(const std::string& path, const StateDict& state, const GptConfig& cfg);

}  // namespace tessera
