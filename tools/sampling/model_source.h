// Where tools/generate gets its model and tokenizer: a training checkpoint (the model config
// and the run config's tokenizer come with it) or a Hugging Face GPT-2 safetensors file.
//
//   LoadedModel m = load_from_checkpoint(".runs/x/checkpoints");   // follows `latest`
//   std::unique_ptr<data::Tokenizer> tok = load_tokenizer_for(m, /*path=*/"");
//   sample(*m.model, tok->encode("\n"), 200, options, on_token);
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "models/gpt2/gpt.h"
#include "tools/data/tokenizer.h"

namespace tessera::sampling {

struct LoadedModel {
  std::unique_ptr<Gpt> model;  // weights loaded, in eval mode (dropout off)
  bool from_checkpoint = false;
  // The tokenizer.json the checkpoint's run config names (data.tokenizer, resolved as the
  // trainer does); empty when the checkpoint holds no run config, and for Hugging Face
  // weights, which use the GPT-2 BPE.
  std::string tokenizer;
  // Why `tokenizer` is empty for a checkpoint: no run config, or one that does not parse.
  std::string no_tokenizer_reason;
  std::string description;  // one line for the log: what was loaded from where
};

// Loads the model of a checkpoint written by train::CheckpointDir, a step directory or a
// root (train::resolve_checkpoint_dir), from its state.json's
// "model" config and model.safetensors, both verified against the manifest; the optimizer
// state is not read).
LoadedModel load_from_checkpoint(const std::string& path);

// Loads Hugging Face GPT-2 weights. The config comes from the tensor shapes and the file's
// metadata (infer_hf_config); n_head, which no shape determines, comes from the metadata,
// else from the preset `model` ("gpt2", "gpt2-medium", ...), else from the preset whose
// depth and width match. A preset that disagrees with the file is an error.
LoadedModel load_from_hf(const std::string& path, const std::string& model = "");

// The tokenizer to decode `m`'s tokens with: the file at `path` when given, else the
// checkpoint's m.tokenizer (an error when it has none), else (Hugging Face weights) the
// GPT-2 BPE from Gpt2Bpe::default_dir(). Its vocabulary must fit the model's.
std::unique_ptr<data::Tokenizer> load_tokenizer_for(const LoadedModel& m, const std::string& path);

}  // namespace tessera::sampling
