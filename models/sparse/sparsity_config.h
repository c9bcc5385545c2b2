// DeepSpeed's `sparse_attention` config section and the block layouts it describes
// (deepspeed/ops/sparse_attention/sparsity_config.py).
//
//   "sparse_attention": {"mode": "fixed", "block": 16, "num_local_blocks": 4,
//                        "num_global_blocks": 1, "attention": "unidirectional"}
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/tensor.h"

namespace tessera {

enum class SparsityMode : uint8_t {
  dense,                 // every block
  fixed,                 // Sparse Transformer "fixed": local windows + global columns
  variable,              // random + variable local windows + global indices or ranges
  bigbird,               // random + sliding window + global rows and columns
  bslongformer,          // sliding window + global indices or ranges
  local_sliding_window,  // sliding window only (DeepSpeed: Python API only)
};

// DeepSpeed's mode name ("dense", "fixed", ..., "local_sliding_window").
const char* sparsity_mode_name(SparsityMode mode);

// Every key of every mode, with the JSON defaults of DeepSpeed's config.py; a mode reads
// only its own (the table in deepspeed.md 1.9).
struct SparsityConfig {
  SparsityMode mode = SparsityMode::fixed;
  int64_t block = 16;
  bool different_layout_per_head = false;
  int64_t num_local_blocks = 4;   // fixed
  int64_t num_global_blocks = 1;  // fixed, bigbird
  // "attention": "unidirectional" | "bidirectional"; from_json's default is bidirectional,
  // but unidirectional for local_sliding_window (as DeepSpeed's class).
  bool unidirectional = false;
  bool horizontal_global_attention = false;         // fixed, variable
  int64_t num_different_global_patterns = 1;        // fixed
  int64_t num_random_blocks = 0;                    // variable, bigbird
  std::vector<int64_t> local_window_blocks = {4};   // variable
  std::vector<int64_t> global_block_indices = {0};  // variable, bslongformer
  std::vector<int64_t> global_block_end_indices;    // variable, bslongformer; empty: None
  int64_t num_sliding_window_blocks = 3;            // bigbird, bslongformer, local_sliding_window

  // Reads the section: "mode" (default "fixed") and the keys that mode uses, with their
  // defaults. A key another mode uses is an error naming the modes that use it (DeepSpeed
  // would silently drop it); values are type- and range-checked; then validate().
  static SparsityConfig from_json(JsonObjectReader section);
  // The mode and the keys it uses (checkpoint manifests compare it on resume).
  nlohmann::json to_json() const;
  // DeepSpeed's constructor checks, which do not depend on the sequence length: fixed's
  // num_local_blocks % num_global_blocks, num_different_global_patterns needing
  // different_layout_per_head and <= num_local_blocks / num_global_blocks, horizontal
  // global attention needing bidirectional, global start/end lists of equal length with
  // start < end. Messages are DeepSpeed's, prefixed with `where`.
  void validate(const std::string& where = "[sparse_attention] ") const;
};

// The (H, nb, nb) i64 layout of `config` for `num_heads` heads at `seq_len` positions,
// nb = seq_len / block: DeepSpeed's construction for the mode, one layout per head when
// different_layout_per_head, else head 0's copied to every head. Random blocks come from
// a Philox stream keyed by (seed, head, row), so every rank that passes the same seed
// builds the same layout without communication. Throws DeepSpeed's errors: seq_len not a
// multiple of block ("Sequence Length, L, needs to be dividable by Block size b!"), and
// random, sliding-window or global counts beyond nb (local windows are cut at nb, as in
// DeepSpeed). Bigbird's unidirectional rows with fewer past blocks than num_random_blocks
// take them all (DeepSpeed's random.sample raises there).
Tensor make_sparsity_layout(const SparsityConfig& config, int64_t num_heads, int64_t seq_len,
                            uint64_t seed);

}  // namespace tessera
