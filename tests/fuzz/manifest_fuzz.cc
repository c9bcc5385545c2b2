// Fuzzes a checkpoint's manifest.json (tools/trainer/checkpoint.h): a valid checkpoint of
// two tensors is saved once, and each input replaces its manifest before it is loaded.
// Seeds: tests/fuzz/corpus/manifest/ (the saved manifest's form).
#include <fstream>

#include "core/factories.h"
#include "tests/fuzz/fuzz_target.h"
#include "tools/trainer/checkpoint.h"

namespace tessera::fuzz {

FuzzTarget make_fuzz_target(const std::filesystem::path& work_dir) {
  train::CheckpointContents c;
  c.model = {{"w", ones({2, 3})}, {"b", zeros({3})}};
  c.optimizer = {{"w.exp_avg", zeros({2, 3})}};
  c.state = {{"step", 1}};
  const std::string dir = train::CheckpointDir((work_dir / "ckpt").string(), 0).save(1, c);
  return {{"\"format\"", "\"version\"", "\"files\"", "\"name\"", "\"bytes\"", "\"fnv1a64\"",
           "\"step\"", "\"world\"", "\"model.safetensors\"", "\"optimizer.safetensors\"",
           "\"state.json\"", "\"../state.json\"", "\"/etc/hostname\"", "\"manifest.json\""},
          [dir](const std::string& input) {
            std::ofstream(dir + "/manifest.json", std::ios::binary | std::ios::trunc) << input;
            train::load_checkpoint(dir);
          }};
}

}  // namespace tessera::fuzz
