// Training checkpoints: one directory per step, committed atomically, with a `latest`
// pointer, verified on load.
//
//   <root>/latest                      "step_00000500\n", replaced atomically after a commit
//   <root>/step_00000500/model.safetensors    the whole weights (written by rank 0; not
//                                              with ZeRO stage 3 or 16-bit stages 1-2)
//                       /optimizer.safetensors the whole optimizer state (ZeRO stage 0), or
//                       /zero_pp_rank_<r>_mp_rank_00_optim_states.safetensors
//                                              rank r's optimizer shard (stages 1-3); at
//                                              stage 3 and 16-bit stages 1-2 also its
//                                              (f32) parameter shard ("param")
//                       /model_part_<s>.safetensors, optimizer_part_<s>.safetensors
//                                      pipeline stage s's whole tensors (pipeline and
//                                      tensor-parallel runs; instead of the files above)
//                       /expp_rank_<e>_model_states.safetensors,
//                       expp_rank_<e>_optim_states.safetensors
//                                      expert parallelism: expert-parallel rank e's experts'
//                                      whole weights and optimizer state (Note [Expert
//                                      checkpoints] in parallel/engine/engine.h)
//                       /rank_state_<r>.safetensors
//                                      rank r's per-rank optimizer state (the 1-bit
//                                      optimizers' error buffers and local values)
//                       /state.json    step counters, scheduler, RNG, data cursor, config,
//                                      world size and ZeRO layout
//                       /manifest.json written last: each file's size and FNV-1a 64 hash
//
// Note [Atomic checkpoints]
// A checkpoint is written into "<root>/.step_00000500.tmp", every file fsync'ed, the manifest
// last; then the directory is renamed to its final name and the parent fsync'ed, and only
// then does `latest` move. A crash at any point leaves `latest` naming a complete, verified
// checkpoint (or no checkpoint at all); leftovers of a crashed save are removed by the next.
// With several data-parallel ranks, rank 0 prepares the directory, every rank writes its
// shard, and rank 0 writes the manifest and commits once all have written (barriers).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/module.h"
#include "parallel/comm/communicator.h"
#include "parallel/engine/engine.h"

namespace tessera::train {

// The key of a rank's parameter shard in its optimizer shard file (ZeRO stage 3, and
// 16-bit stages 1-2, whose checkpoints have no model.safetensors; load_checkpoint()
// reassembles the weights).
using parallel::kParameterShard;

// The engine's tensors (parallel::EngineCheckpoint: whole weights, whole or sharded
// optimizer state, a pipeline run's parts, expert parts, per-rank state) and state.json.
// Loading, the parts come back merged into `model` and `optimizer`, as if one process had
// saved them, the expert parts into `experts` and `expert_optimizer` (the weights into
// `model` where load_checkpoint() makes whole weights), and `rank_state` is the state of
// the rank load_checkpoint() was asked for.
struct CheckpointContents : parallel::EngineCheckpoint {
  nlohmann::json state;  // state.json: the engine's counters and the trainer's (see Trainer)
};

class CheckpointDir {
 public:
  // Checkpoints under `root` (created on first save); keeps the newest `keep_last`
  // (0: all).
  CheckpointDir(std::string root, int64_t keep_last);

  // Writes the checkpoint of optimizer step `step`, moves `latest` to it and prunes old
  // ones. Returns its directory. Collective over `comm` (nullptr: one process): model,
  // optimizer and state come from rank 0; each rank gives its own optimizer shard, or none
  // on every rank.
  std::string save(int64_t step, const CheckpointContents& contents,
                   parallel::Communicator* comm = nullptr) const;
  // The directory `latest` names, or nullopt when there is no checkpoint yet. Throws when
  // `latest` names a directory that does not exist.
  std::optional<std::string> latest() const;
  // Note [Resume fallback]
  // A run resumes from the newest committed checkpoint that loads and verifies: the one
  // `latest` names, else the other committed steps, newest first. A missing or dangling
  // `latest`, and each checkpoint skipped, is a warning naming what was wrong; when
  // checkpoints exist and none loads the run fails, so it never restarts from step 0
  // silently and then prunes the steps it ignored (--no-resume starts over on purpose). A
  // later save of a skipped step replaces it.

  // The newest committed checkpoint that loads and verifies (Note [Resume fallback]), with
  // its optimizer and rank `rank_state_of`'s per-rank state, and its directory; nullopt
  // when there is none. Every skip is passed to `warn`; throws when checkpoints exist but
  // none loads.
  std::optional<std::pair<std::string, CheckpointContents>> load_newest(
      int rank_state_of, const std::function<void(const std::string&)>& warn) const;
  // Creates the root (as the first save would) and writes and removes a file in it named
  // after `rank`, so that a path that cannot hold checkpoints fails at start-up, naming
  // the path and the reason, rather than at the first save.
  void check_writable(int rank) const;
  const std::string& root() const { return root_; }

 private:
  // The pipeline form of save() (CheckpointContents::parts).
  std::string save_parts(int64_t step, const CheckpointContents& contents,
                         parallel::Communicator* comm, const std::filesystem::path& tmp,
                         const std::filesystem::path& final_dir) const;
  // Lists `files` in the manifest, renames `tmp` to `final_dir`, moves `latest`, prunes.
  void commit(int64_t step, int world, const std::vector<std::string>& files,
              const std::filesystem::path& tmp, const std::filesystem::path& final_dir) const;
  void prune() const;
  // The committed checkpoints to resume from, best first: the one `latest` names, then
  // every other committed step directory (manifest present), newest first. When `latest`
  // is missing or names no directory while committed steps exist, `*note` says so (for a
  // warning); it is cleared otherwise.
  std::vector<std::string> resume_candidates(std::string* note) const;

  std::string root_;
  int64_t keep_last_;
};

// Reads a checkpoint directory after checking every file against its manifest, before any
// tensor is read; errors name the file and what was expected and found (a missing
// manifest means an incomplete save). Without `with_optimizer` (generation, evaluation),
// the contents hold no optimizer state, and the optimizer files are neither checked nor
// read unless they hold the weights. Weights saved as parameter shards (ZeRO stage 3,
// 16-bit stages 1-2) are reassembled into whole tensors with the layout in state.json
// ($.zero.layout), and the parameter shards are dropped from optimizer_shards: the
// contents look the same whichever stage saved them.
// With `rank_state_of` >= 0 (and with_optimizer), that rank's per-rank state is read too
// when the checkpoint has one (checked against the manifest like every file read).
// Without `whole_weights` (and with_optimizer: a resume), parameter shards stay in
// optimizer_shards and `model` is not made from them: Engine::load_state places them, as
// they are where the layout is the saving run's (Note [Streamed checkpoints] in
// parallel/zero/zero_optimizer.h). The tensors are views of the mapped files (Note [Mapped
// tensors] in models/io/safetensors.h), read as they are used.
CheckpointContents load_checkpoint(const std::string& dir, bool with_optimizer = true,
                                   int rank_state_of = -1, bool whole_weights = true);

// The checkpoint step directory `path` names: `path` itself when it holds manifest.json,
// else the directory its `latest` file names (a checkpoint root). Throws when it is
// neither.
std::string resolve_checkpoint_dir(const std::string& path);

// Throws on every rank unless each rank of `world` found the same checkpoint `step` (-1:
// none) under `root`, naming this rank's and the range found. Collective.
void check_same_checkpoint(parallel::Communicator& world, int64_t step, const std::string& root);

// The step a checkpoint directory is named after ("step_00000500" -> 500).
int64_t checkpoint_step(const std::string& dir);

// The file of rank r's optimizer shard: "zero_pp_rank_<r>_mp_rank_00_optim_states.safetensors".
std::string optimizer_shard_name(int rank);
// The files of expert-parallel rank e's experts: "expp_rank_<e>_model_states.safetensors",
// "expp_rank_<e>_optim_states.safetensors".
std::string expert_model_name(int ep_rank);
std::string expert_optimizer_name(int ep_rank);
// The file of rank r's per-rank optimizer state: "rank_state_<r>.safetensors".
std::string rank_state_name(int rank);
// The files of pipeline stage s's part: "model_part_<s>.safetensors",
// "optimizer_part_<s>.safetensors".
std::string model_part_name(int stage);
std::string optimizer_part_name(int stage);

}  // namespace tessera::train
