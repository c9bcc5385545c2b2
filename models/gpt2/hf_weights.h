// Conversion between Hugging Face GPT-2 weights and Tessera's GPT state dict.
//
// Note [GPT-2 weight layouts]
// Tessera names follow Hugging Face's GPT2LMHeadModel ("transformer.h.3.attn.c_attn.weight")
// but differ in two ways:
//   - HF stores the Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) as
//     (in, out); Tessera stores every Linear weight as (out, in), nn.Linear style.
//   - HF's wte has vocab_size rows; Tessera's has cfg.padded_vocab_size() rows, the padding
//     rows zero (they are never predicted).
// HF files may drop the "transformer." prefix (the official gpt2 model.safetensors does),
// may hold the attention-mask buffers "h.N.attn.bias" / "h.N.attn.masked_bias" (skipped),
// and may hold "lm_head.weight", which equals wte when the embeddings are tied (then it is
// ignored). Converted tensors keep their dtype and device; a tensor that needs no change
// may share storage with the input.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "autograd/module.h"
#include "models/gpt2/config.h"

namespace tessera {

// The metadata key under which save_hf_safetensors stores GptConfig::to_json().dump().
inline constexpr const char* kGptConfigMetadataKey = "tessera.gpt_config";

// Every parameter of Tessera's GPT for `cfg`, with its shape, in Hugging Face's order:
// transformer.wte.weight (Vp, C), transformer.wpe.weight (block_size, C), per layer ln_1,
// attn.c_attn (3C, C), attn.c_proj (C, C), ln_2, mlp.c_fc (4C, C), mlp.c_proj (C, 4C),
// then transformer.ln_f, and lm_head.weight (Vp, C) when the embeddings are untied (Gpt's
// named_parameters() lists lm_head first: compare as sets).
// Bias tensors (LayerNorm and Linear) only when cfg.bias.
std::vector<std::pair<std::string, Shape>> gpt_parameter_shapes(const GptConfig& cfg);

// Checks that `state` holds exactly the tensors of gpt_parameter_shapes(cfg) with those
// shapes and a floating dtype; throws one line listing every problem, led by `context`.
void check_gpt_state_dict(const StateDict& state, const GptConfig& cfg, const std::string& context);

// Hugging Face tensors -> Tessera's state dict, in gpt_parameter_shapes order (Note [GPT-2
// weight layouts]). Every expected tensor must be present with the HF shape; unknown names
// are errors. All problems are reported together in one line.
StateDict hf_to_tessera(const StateDict& hf, const GptConfig& cfg);

// Tessera's state dict -> Hugging Face tensors, named with the "transformer." prefix, Conv1D
// weights as (in, out) contiguous copies, wte (and an untied lm_head) trimmed to vocab_size
// rows. No lm_head.weight when tied (as HF's save_pretrained writes it).
StateDict tessera_to_hf(const StateDict& ours, const GptConfig& cfg);

// A GptConfig read off the shapes of HF tensors: n_layer (from the h.N indices, which must
// be 0..L-1), n_embd and vocab_size (wte), block_size (wpe), bias (whether h.0.ln_1.bias
// exists), tie_word_embeddings (false only when lm_head.weight is present and differs from
// wte). n_head is not determined by any shape: it is taken from `metadata` (the full config
// at kGptConfigMetadataKey, as save_hf_safetensors writes, or a plain integer at "n_head"),
// and is 0 when neither is present: the caller must set it (cfg.validate() rejects 0).
// A config in the metadata that disagrees with the shapes is an error. dropout and
// layer_norm_eps come from that config when present, else keep GptConfig's defaults.
GptConfig infer_hf_config(const StateDict& hf,
                          const std::map<std::string, std::string>& metadata = {});

// read_safetensors + hf_to_tessera; errors name the file.
StateDict load_hf_safetensors(const std::string& path, const GptConfig& cfg);
// tessera_to_hf + write_safetensors with metadata {"format": "pt", kGptConfigMetadataKey:
// cfg.to_json()}; the file loads in transformers' GPT2LMHeadModel.
void save_hf_safetensors(const std::string& path, const StateDict& ours, const GptConfig& cfg);

}  // namespace tessera
