// Training checkpoints: one directory per step, committed atomically, with a `latest`
// pointer, verified on load.
//
//   <root>/latest                      "step_00000500\n", replaced atomically after a commit
//   <root>/step_00000500/model.safetensors
//                       /optimizer.safetensors
//                       /state.json    step counters, scheduler, RNG, data cursor, config
//                       /manifest.json written last: each file's size and FNV-1a 64 hash
//
// Note [Atomic checkpoints]
// A checkpoint is written into "<root>/.step_00000500.tmp", every file fsync'ed, the manifest
// last; then the directory is renamed to its final name and the parent fsync'ed, and only
// then does `latest` move. A crash at any point leaves `latest` naming a complete, verified
// checkpoint (or no checkpoint at all); leftovers of a crashed save are removed by the next.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "autograd/module.h"

namespace tessera::train {

struct CheckpointContents {
  StateDict model;
  StateDict optimizer;
  nlohmann::json state;  // trainer state (see Trainer)
};

class CheckpointDir {
 public:
  // Checkpoints under `root` (created on first save); keeps the newest `keep_last`
  // (0: all).
  CheckpointDir(std::string root, int64_t keep_last);

  // Writes the checkpoint of optimizer step `step`, moves `latest` to it and prunes old
  // ones. Returns its directory.
  std::string save(int64_t step, const CheckpointContents& contents) const;
  // The directory `latest` names, or nullopt when there is no checkpoint yet. Throws when
  // `latest` names a directory that does not exist.
  std::optional<std::string> latest() const;
  const std::string& root() const { return root_; }

 private:
  void prune() const;

  std::string root_;
  int64_t keep_last_;
};

// Reads a checkpoint directory after checking every file against its manifest; errors name
// the file and what was expected and found (a missing manifest means an incomplete save).
// Without `with_optimizer` (generation, evaluation), optimizer.safetensors is neither
// checked nor read and the contents' optimizer is empty.
CheckpointContents load_checkpoint(const std::string& dir, bool with_optimizer = true);

// FNV-1a 64 of a file's bytes, as 16 hex digits.
std::string file_fnv1a64(const std::string& path);

}  // namespace tessera::train
