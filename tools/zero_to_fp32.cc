// zero_to_fp32: one safetensors file of a checkpoint's whole fp32 weights, whichever ZeRO
// stage and world size saved it (DeepSpeed's zero_to_fp32.py). Stage 3 checkpoints, and
// fp16/bf16 ones at stages 1-2 (their f32 masters are sharded), hold the weights only as
// the ranks' parameter shards; this reassembles them with the layout recorded in
// state.json. Tensor names are the model's parameter names
// ("transformer.h.0.attn.c_attn.weight", ...), so Module::load_state_dict takes the file.
//
//   bazel-bin/tools/zero_to_fp32 --checkpoint .runs/x/checkpoints --out weights.safetensors
//
// Every file the weights come from is verified against the manifest first; the output is
// written atomically. Exit codes: 0 done, 2 bad flags, 1 any other error.
#include <cstdio>
#include <string>

#include "core/tensor.h"
#include "models/io/safetensors.h"
#include "tools/cli/flags.h"
#include "tools/trainer/checkpoint.h"

namespace {

constexpr const char* kUsage =
    R"(usage: zero_to_fp32 --checkpoint PATH --out FILE

Writes the whole fp32 weights of a training checkpoint to one safetensors file.

  --checkpoint PATH   a checkpoint step directory, or a checkpoint root holding `latest`
  --out FILE          the safetensors file to write (replaced atomically)
)";

int body(int argc, char** argv) {
  using namespace tessera;
  const cli::Flags flags(argc, argv,
                         {{"checkpoint", cli::Flag::kValue}, {"out", cli::Flag::kValue}});
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const std::string checkpoint = flags.required("checkpoint");
  const std::string out = flags.required("out");
  cli::enter_working_directory();
  const std::string dir = train::resolve_checkpoint_dir(checkpoint);
  const train::CheckpointContents c = train::load_checkpoint(dir, /*with_optimizer=*/false);
  write_safetensors(out, c.model, {{"format", "pt"}});
  int64_t elements = 0;
  for (const auto& [name, t] : c.model) elements += t.numel();
  std::printf("%s: %zu tensors, %lld elements -> %s\n", dir.c_str(), c.model.size(),
              static_cast<long long>(elements), out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::cli::run_tool("zero_to_fp32", kUsage, body, argc, argv);
}
