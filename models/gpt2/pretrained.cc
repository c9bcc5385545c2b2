#include "models/gpt2/pretrained.h"

#include "core/error.h"
#include "models/gpt2/hf_weights.h"
#include "models/gpt2/llmc_weights.h"
#include "parallel/engine/model_parallel_state.h"

namespace tessera {

void load_pretrained(Gpt& model, const std::string& path) {
  const GptConfig& cfg = model.config();
  StateDict full;
  if (path.size() > 4 && path.substr(path.size() - 4) == ".bin") {
    LlmcCheckpoint ck = read_llmc_checkpoint(path);
    TS_CHECK(ck.config.n_layer == cfg.n_layer && ck.config.n_embd == cfg.n_embd &&
                 ck.config.padded_vocab_size() == cfg.padded_vocab_size(),
             "[gpt2] ", path, " holds a GPT-2 with ", ck.config.n_layer, " layers, width ",
             ck.config.n_embd, ", vocab ", ck.config.vocab_size, "; the config's model has ",
             cfg.n_layer, ", ", cfg.n_embd, ", ", cfg.vocab_size);
    full = std::move(ck.state);
  } else {
    full = load_hf_safetensors(path, cfg);
  }
  const parallel::Communicator& group = model.model_group();
  if (group.size() == 1 && model.part().whole(cfg)) return model.load_state_dict(full);
  model.load_state_dict(
      parallel::take_local(full, model.named_parameters(), group.rank(), group.size(), false));
}

}  // namespace tessera
