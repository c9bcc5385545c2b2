// Pretrained GPT-2 weights into a model of any layout: Hugging Face safetensors or an llm.c
// checkpoint.
#pragma once

#include <string>

#include "models/gpt2/gpt.h"

namespace tessera {

// Loads `path` into `model`: Hugging Face GPT-2 safetensors (models/gpt2/hf_weights.h), or
// an llm.c checkpoint when the name ends in ".bin" (models/gpt2/llmc_weights.h); all of it,
// or the pipeline stage and tensor-parallel slices the model holds. Throws, naming the
// file, when its model differs from `model`'s config.
void load_pretrained(Gpt& model, const std::string& path);

}  // namespace tessera
