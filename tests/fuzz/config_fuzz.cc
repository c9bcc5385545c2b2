// Fuzzes the run config reader: strict JSON, then every DeepSpeed and Tessera key
// (tools/trainer/run_config.h). Seeds: tests/fuzz/corpus/config/.
#include "core/json.h"
#include "tests/fuzz/fuzz_target.h"
#include "tools/trainer/run_config.h"

namespace tessera::fuzz {

FuzzTarget make_fuzz_target(const std::filesystem::path& work_dir) {
  return {{"\"train_batch_size\"",
           "\"train_micro_batch_size_per_gpu\"",
           "\"gradient_accumulation_steps\"",
           "\"optimizer\"",
           "\"scheduler\"",
           "\"params\"",
           "\"type\"",
           "\"lr\"",
           "\"betas\"",
           "\"zero_optimization\"",
           "\"stage\"",
           "\"fp16\"",
           "\"bf16\"",
           "\"enabled\"",
           "\"pipeline\"",
           "\"stages\"",
           "\"tensor_parallel\"",
           "\"tp_size\"",
           "\"model\"",
           "\"n_layer\"",
           "\"n_head\"",
           "\"n_embd\"",
           "\"vocab_size\"",
           "\"block_size\"",
           "\"dropout\"",
           "\"data\"",
           "\"trainer\"",
           "\"steps\"",
           "\"seed\"",
           "\"AdamW\"",
           "\"gpt2\"",
           "\"bert\"",
           "\"preset\"",
           "\"sparse_attention\"",
           "\"gradient_clipping\"",
           "\"loss_scale\"",
           "\"checkpoint_dir\"",
           "\"keep_last\""},
          [run_dir = (work_dir / "run").string()](const std::string& input) {
            train::parse_run_config(parse_json(input, "config.json"), "config.json", run_dir, 1);
          }};
}

}  // namespace tessera::fuzz
