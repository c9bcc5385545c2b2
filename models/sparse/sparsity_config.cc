// DeepSpeed's sparsity configs: the JSON section, the constructor checks, and the layouts
// built step by step as deepspeed/ops/sparse_attention/sparsity_config.py builds them.
#include "models/sparse/sparsity_config.h"

#include <algorithm>
#include <array>
#include <limits>
#include <numeric>
#include <string_view>

#include "core/error.h"
#include "core/factories.h"
#include "core/philox.h"

namespace tessera {
namespace {

constexpr std::array<SparsityMode, 6> kModes = {
    SparsityMode::dense,   SparsityMode::fixed,        SparsityMode::variable,
    SparsityMode::bigbird, SparsityMode::bslongformer, SparsityMode::local_sliding_window,
};

using ModeSet = uint32_t;
constexpr ModeSet bit(SparsityMode m) { return ModeSet{1} << static_cast<unsigned>(m); }
constexpr ModeSet kFixed = bit(SparsityMode::fixed);
constexpr ModeSet kVariable = bit(SparsityMode::variable);
constexpr ModeSet kBigbird = bit(SparsityMode::bigbird);
constexpr ModeSet kLongformer = bit(SparsityMode::bslongformer);
constexpr ModeSet kSliding = bit(SparsityMode::local_sliding_window);
constexpr ModeSet kAllButDense = kFixed | kVariable | kBigbird | kLongformer | kSliding;

struct KeyUse {
  const char* key;
  ModeSet modes;
};

// Which mode reads which key (deepspeed.md 1.9, DeepSpeed's get_sparse_attention mappers).
// "attention" is wider than DeepSpeed's JSON mapper, which forwards it only for fixed and
// variable although the bigbird, bslongformer and local-sliding-window classes take it.
constexpr std::array<KeyUse, 12> kKeys = {{
    {"block", kAllButDense | bit(SparsityMode::dense)},
    {"different_layout_per_head", kAllButDense},
    {"num_local_blocks", kFixed},
    {"num_global_blocks", kFixed | kBigbird},
    {"attention", kAllButDense},
    {"horizontal_global_attention", kFixed | kVariable},
    {"num_different_global_patterns", kFixed},
    {"num_random_blocks", kVariable | kBigbird},
    {"local_window_blocks", kVariable},
    {"global_block_indices", kVariable | kLongformer},
    {"global_block_end_indices", kVariable | kLongformer},
    {"num_sliding_window_blocks", kBigbird | kLongformer | kSliding},
}};

bool uses(SparsityMode mode, std::string_view key) {
  for (const KeyUse& k : kKeys) {
    if (key == k.key) return (k.modes & bit(mode)) != 0;
  }
  TS_INTERNAL_ASSERT(false, "sparsity key ", key, " is missing from kKeys");
  return false;
}

std::string modes_of(ModeSet modes) {
  std::string list;
  for (SparsityMode m : kModes) {
    if (modes & bit(m)) list += str_cat(list.empty() ? "" : ", ", sparsity_mode_name(m));
  }
  return list;
}

std::string list_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += str_cat(i ? ", " : "", v[i]);
  return s + "]";
}

constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

// ---- layouts -------------------------------------------------------------------------------

// One head's (nb, nb) slice of the layout. fill() clamps its ends to nb as Python slices do
// (DeepSpeed writes layout[h, r0:r1, c0:c1] = 1 with r1, c1 possibly past the end).
struct HeadLayout {
  int64_t* data;
  int64_t nb;

  void fill(int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    r1 = std::min(r1, nb);
    c1 = std::min(c1, nb);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) data[r * nb + c] = 1;
    }
  }
  void tril() {
    for (int64_t r = 0; r < nb; ++r) std::fill(data + r * nb + r + 1, data + (r + 1) * nb, 0);
  }
};

void check_count(const char* what, int64_t count, int64_t nb) {
  TS_CHECK(count <= nb, "[sparse_attention] Number of ", what, ", ", count,
           ", must be smaller than overall number of blocks in a row, ", nb, "!");
}

// Note [Random blocks from Philox]
// DeepSpeed draws random.sample(candidates, n) from Python's global RNG and broadcasts the
// layout from rank 0. Tessera draws the same kind of sample (n distinct columns, uniform)
// by a partial Fisher-Yates shuffle whose k-th swap uses Philox word k of the stream
// (key = hash(seed), counter = (k / 4, head << 32 | row)): a pure function of
// (seed, head, row), so every rank builds the same layout without communication. The
// index is the high half of word * span, off uniform by at most span / 2^32.
void set_random_row(HeadLayout& head, int64_t row, int64_t candidates, int64_t count, uint64_t key,
                    uint64_t stream) {
  std::vector<int64_t> pool(static_cast<size_t>(candidates));
  std::iota(pool.begin(), pool.end(), int64_t{0});
  std::array<uint32_t, 4> words{};
  // Bigbird's unidirectional early rows have fewer candidates than count; they take all.
  for (int64_t k = 0; k < std::min(count, candidates); ++k) {
    if (k % 4 == 0) words = philox4x32(static_cast<uint64_t>(k / 4), stream, key);
    const uint64_t span = static_cast<uint64_t>(candidates - k);
    const int64_t j = k + static_cast<int64_t>((uint64_t{words[k % 4]} * span) >> 32);
    std::swap(pool[k], pool[j]);
    head.data[row * head.nb + pool[k]] = 1;
  }
}

void set_random(const SparsityConfig& c, HeadLayout& head, int64_t h, uint64_t seed) {
  check_count("random blocks", c.num_random_blocks, head.nb);
  if (c.num_random_blocks == 0) return;
  const uint64_t key = hash_name(seed, "sparse_attention.random_blocks");
  // Variable samples from the whole row even when unidirectional (as DeepSpeed does);
  // bigbird samples only the past when unidirectional.
  const bool past_only = c.mode == SparsityMode::bigbird && c.unidirectional;
  for (int64_t row = 0; row < head.nb; ++row) {
    const uint64_t stream = (static_cast<uint64_t>(h) << 32) | static_cast<uint64_t>(row);
    set_random_row(head, row, past_only ? row + 1 : head.nb, c.num_random_blocks, key, stream);
  }
}

// Rows [start, stop) attend to cols [start, stop), or [start, row] when unidirectional.
void set_local_window(const SparsityConfig& c, HeadLayout& head, int64_t start, int64_t stop) {
  for (int64_t r = start; r < std::min(stop, head.nb); ++r) {
    head.fill(r, r + 1, start, c.unidirectional ? r + 1 : stop);
  }
}

// Column (and with horizontal, row) blocks [start, stop): every row attends to them, or
// only rows from `start` on when causal.
void set_global_blocks(HeadLayout& head, int64_t start, int64_t stop, bool causal,
                       bool horizontal) {
  head.fill(causal ? start : 0, head.nb, start, stop);
  if (horizontal) head.fill(start, stop, 0, head.nb);
}

// Global indices, or [start, end) ranges when end indices are given; those at or past nb
// are skipped, as in DeepSpeed.
void set_global_indices(const SparsityConfig& c, HeadLayout& head, bool causal, bool horizontal) {
  const std::vector<int64_t>& starts = c.global_block_indices;
  for (size_t i = 0; i < starts.size(); ++i) {
    if (starts[i] >= head.nb) continue;
    const int64_t stop =
        c.global_block_end_indices.empty() ? starts[i] + 1 : c.global_block_end_indices[i];
    set_global_blocks(head, starts[i], stop, causal, horizontal);
  }
}

void set_sliding_window(const SparsityConfig& c, HeadLayout& head, bool causal_window) {
  check_count("sliding window blocks", c.num_sliding_window_blocks, head.nb);
  const int64_t w = c.num_sliding_window_blocks / 2;
  for (int64_t r = 0; r < head.nb; ++r) {
    head.fill(r, r + 1, std::max<int64_t>(0, r - w), causal_window ? r + 1 : r + w + 1);
  }
}

// Sparse Transformer "fixed": local windows of L blocks, and in each window G global
// columns ending (1 + h % P) * G blocks before the window's end.
void build_fixed(const SparsityConfig& c, HeadLayout& head, int64_t h) {
  const int64_t nb = head.nb, L = c.num_local_blocks, G = c.num_global_blocks;
  // DeepSpeed would index a negative Python slice here; too short to hold one global block.
  check_count("global blocks", G, nb);
  for (int64_t i = 0; i < nb; i += L) set_local_window(c, head, i, i + L);
  const int64_t first = L - (1 + h % c.num_different_global_patterns) * G;
  const int64_t full_end = nb - nb % L;
  for (int64_t i = first; i < full_end; i += L) {
    set_global_blocks(head, i, i + G, c.unidirectional, c.horizontal_global_attention);
  }
  // A short last window keeps its global blocks, moved left to fit.
  if (full_end < nb) {
    const int64_t start = std::min(full_end + first, nb - G);
    set_global_blocks(head, start, start + G, c.unidirectional, c.horizontal_global_attention);
  }
}

void build_variable(const SparsityConfig& c, HeadLayout& head, int64_t h, uint64_t seed) {
  set_random(c, head, h, seed);
  int64_t start = 0;
  for (int64_t size : c.local_window_blocks) {
    set_local_window(c, head, start, start + size);
    start += size;
  }
  // The last window size repeats over the rest of the row.
  const int64_t last = c.local_window_blocks.back();
  for (int64_t i = start; i < head.nb; i += last) set_local_window(c, head, i, i + last);
  set_global_indices(c, head, c.unidirectional, c.horizontal_global_attention);
}

void build_bigbird(const SparsityConfig& c, HeadLayout& head, int64_t h, uint64_t seed) {
  set_random(c, head, h, seed);
  set_sliding_window(c, head, /*causal_window=*/false);
  check_count("global blocks", c.num_global_blocks, head.nb);
  head.fill(0, c.num_global_blocks, 0, head.nb);
  head.fill(0, head.nb, 0, c.num_global_blocks);
  if (c.unidirectional) head.tril();
}

void build_bslongformer(const SparsityConfig& c, HeadLayout& head) {
  set_sliding_window(c, head, /*causal_window=*/false);
  // Global blocks are whole rows and columns here; tril() then removes the future.
  set_global_indices(c, head, /*causal=*/false, /*horizontal=*/true);
  if (c.unidirectional) head.tril();
}

void check_global_ranges(const SparsityConfig& c, const std::string& where) {
  for (int64_t idx : c.global_block_indices) {
    TS_CHECK(idx >= 0, where, "global_block_indices: expected indices >= 0, found ",
             list_str(c.global_block_indices));
  }
  if (c.global_block_end_indices.empty()) return;
  TS_CHECK(c.global_block_indices.size() == c.global_block_end_indices.size(), where,
           "Global block start indices length, ", c.global_block_indices.size(),
           ", must be same as global block end indices length, ", c.global_block_end_indices.size(),
           "!");
  for (size_t i = 0; i < c.global_block_indices.size(); ++i) {
    TS_CHECK(c.global_block_indices[i] < c.global_block_end_indices[i], where,
             "Global block start index, ", c.global_block_indices[i],
             ", must be smaller than global block end index, ", c.global_block_end_indices[i], "!");
  }
}

void check_at_least(const std::string& where, const char* key, int64_t value, int64_t lo) {
  TS_CHECK(value >= lo, where, key, ": expected an integer >= ", lo, ", found ", value);
}

}  // namespace

const char* sparsity_mode_name(SparsityMode mode) {
  switch (mode) {
    case SparsityMode::dense:
      return "dense";
    case SparsityMode::fixed:
      return "fixed";
    case SparsityMode::variable:
      return "variable";
    case SparsityMode::bigbird:
      return "bigbird";
    case SparsityMode::bslongformer:
      return "bslongformer";
    case SparsityMode::local_sliding_window:
      return "local_sliding_window";
  }
  TS_INTERNAL_ASSERT(false, "unknown SparsityMode ", static_cast<int>(mode));
  return "";
}

SparsityConfig SparsityConfig::from_json(JsonObjectReader section) {
  std::vector<std::string> names;
  for (SparsityMode m : kModes) names.emplace_back(sparsity_mode_name(m));
  // DeepSpeed raises NotImplementedError for any other mode; the error lists these.
  const std::string name = section.get_one_of("mode", "fixed", names);
  SparsityConfig c;
  for (SparsityMode m : kModes) {
    if (name == sparsity_mode_name(m)) c.mode = m;
  }
  // DeepSpeed drops the keys its mapper does not forward; a key of another mode is more
  // likely a wrong mode than a key meant to be ignored.
  for (const KeyUse& k : kKeys) {
    if ((k.modes & bit(c.mode)) == 0 && section.has(k.key)) {
      TS_FAIL("[sparse_attention] ", section.key_path(k.key), " is not used by mode \"", name,
              "\" (only by ", modes_of(k.modes), "); remove it or change the mode");
    }
  }
  auto read_count = [&](const char* key, int64_t fallback, int64_t lo) {
    return uses(c.mode, key) ? section.get_in_range<int64_t>(key, fallback, lo, kMaxInt) : fallback;
  };
  c.block = read_count("block", c.block, 1);
  c.num_local_blocks = read_count("num_local_blocks", c.num_local_blocks, 1);
  c.num_global_blocks = read_count("num_global_blocks", c.num_global_blocks, 1);
  c.num_different_global_patterns =
      read_count("num_different_global_patterns", c.num_different_global_patterns, 1);
  c.num_random_blocks = read_count("num_random_blocks", c.num_random_blocks, 0);
  c.num_sliding_window_blocks =
      read_count("num_sliding_window_blocks", c.num_sliding_window_blocks, 1);
  if (uses(c.mode, "different_layout_per_head")) {
    c.different_layout_per_head = section.get<bool>("different_layout_per_head", false);
  }
  if (uses(c.mode, "attention")) {
    // LocalSlidingWindowSparsityConfig defaults to unidirectional, the others to bi.
    const bool sliding = c.mode == SparsityMode::local_sliding_window;
    c.unidirectional = section.get_one_of("attention", sliding ? "unidirectional" : "bidirectional",
                                          {"unidirectional", "bidirectional"}) == "unidirectional";
  }
  if (uses(c.mode, "horizontal_global_attention")) {
    c.horizontal_global_attention = section.get<bool>("horizontal_global_attention", false);
  }
  if (uses(c.mode, "local_window_blocks")) {
    c.local_window_blocks = section.get<std::vector<int64_t>>("local_window_blocks", {4});
  }
  if (uses(c.mode, "global_block_indices")) {
    c.global_block_indices = section.get<std::vector<int64_t>>("global_block_indices", {0});
    // null is DeepSpeed's default (None): accepted so that a ds_config runs unchanged.
    const nlohmann::json* ends = section.raw("global_block_end_indices");
    if (ends != nullptr && !ends->is_null()) {
      c.global_block_end_indices =
          section.get<std::vector<int64_t>>("global_block_end_indices", {});
      // Empty means None in the struct; DeepSpeed zips an empty list against the starts.
      TS_CHECK(!c.global_block_end_indices.empty() || c.global_block_indices.empty(),
               "[sparse_attention] ", section.path(), ": Global block start indices length, ",
               c.global_block_indices.size(),
               ", must be same as global block end indices length, 0!");
    }
  }
  section.finish();
  c.validate(str_cat("[sparse_attention] ", section.path(), ": "));
  return c;
}

nlohmann::json SparsityConfig::to_json() const {
  nlohmann::json j;
  j["mode"] = sparsity_mode_name(mode);
  j["block"] = block;
  auto put = [&](const char* key, auto value) {
    if (uses(mode, key)) j[key] = value;
  };
  put("different_layout_per_head", different_layout_per_head);
  put("num_local_blocks", num_local_blocks);
  put("num_global_blocks", num_global_blocks);
  put("attention", unidirectional ? "unidirectional" : "bidirectional");
  put("horizontal_global_attention", horizontal_global_attention);
  put("num_different_global_patterns", num_different_global_patterns);
  put("num_random_blocks", num_random_blocks);
  put("local_window_blocks", local_window_blocks);
  put("global_block_indices", global_block_indices);
  if (!global_block_end_indices.empty()) put("global_block_end_indices", global_block_end_indices);
  put("num_sliding_window_blocks", num_sliding_window_blocks);
  return j;
}

void SparsityConfig::validate(const std::string& where) const {
  check_at_least(where, "block", block, 1);
  switch (mode) {
    case SparsityMode::dense:
      break;
    case SparsityMode::fixed: {
      check_at_least(where, "num_local_blocks", num_local_blocks, 1);
      check_at_least(where, "num_global_blocks", num_global_blocks, 1);
      check_at_least(where, "num_different_global_patterns", num_different_global_patterns, 1);
      TS_CHECK(num_local_blocks % num_global_blocks == 0, where,
               "Number of blocks in a local window, ", num_local_blocks,
               ", must be dividable by number of global blocks, ", num_global_blocks, "!");
      TS_CHECK(!(unidirectional && horizontal_global_attention), where,
               "only \"bi-directional\" attentions can support horizontal global attention!");
      TS_CHECK(num_different_global_patterns == 1 || different_layout_per_head, where,
               "Number of different layouts cannot be more than one when you have set a single "
               "layout for all heads! Set different_layout_per_head to True.");
      const int64_t ratio = num_local_blocks / num_global_blocks;
      TS_CHECK(num_different_global_patterns <= ratio, where,
               "Number of layout versions (num_different_global_patterns), ",
               num_different_global_patterns,
               ", cannot be larger than number of local window blocks divided by number of "
               "global blocks, ",
               num_local_blocks, " / ", num_global_blocks, " = ", ratio, "!");
      break;
    }
    case SparsityMode::variable: {
      check_at_least(where, "num_random_blocks", num_random_blocks, 0);
      bool sizes_ok = !local_window_blocks.empty();
      for (int64_t size : local_window_blocks) sizes_ok = sizes_ok && size >= 1;
      TS_CHECK(sizes_ok, where,
               "local_window_blocks: expected a non-empty list of sizes >= 1, found ",
               list_str(local_window_blocks));
      check_global_ranges(*this, where);
      TS_CHECK(!(unidirectional && horizontal_global_attention), where,
               "only \"bi-directional\" attentions can support horizontal global attention!");
      break;
    }
    case SparsityMode::bigbird:
      check_at_least(where, "num_random_blocks", num_random_blocks, 0);
      check_at_least(where, "num_sliding_window_blocks", num_sliding_window_blocks, 1);
      check_at_least(where, "num_global_blocks", num_global_blocks, 1);
      break;
    case SparsityMode::bslongformer:
      check_at_least(where, "num_sliding_window_blocks", num_sliding_window_blocks, 1);
      check_global_ranges(*this, where);
      break;
    case SparsityMode::local_sliding_window:
      check_at_least(where, "num_sliding_window_blocks", num_sliding_window_blocks, 1);
      break;
  }
}

Tensor make_sparsity_layout(const SparsityConfig& config, int64_t num_heads, int64_t seq_len,
                            uint64_t seed) {
  config.validate();
  TS_CHECK(num_heads >= 1, "[sparse_attention] expected num_heads >= 1, found ", num_heads);
  TS_CHECK(seq_len >= 1, "[sparse_attention] expected seq_len >= 1, found ", seq_len);
  TS_CHECK(seq_len % config.block == 0, "[sparse_attention] Sequence Length, ", seq_len,
           ", needs to be dividable by Block size ", config.block, "!");
  const int64_t nb = seq_len / config.block;
  Tensor layout = zeros({num_heads, nb, nb}, {DType::i64});
  int64_t* data = layout.data_ptr<int64_t>();
  const bool per_head = config.different_layout_per_head && config.mode != SparsityMode::dense;
  const int64_t built = per_head ? num_heads : 1;
  for (int64_t h = 0; h < built; ++h) {
    HeadLayout head{data + h * nb * nb, nb};
    switch (config.mode) {
      case SparsityMode::dense:
        head.fill(0, nb, 0, nb);
        break;
      case SparsityMode::fixed:
        build_fixed(config, head, h);
        break;
      case SparsityMode::variable:
        build_variable(config, head, h, seed);
        break;
      case SparsityMode::bigbird:
        build_bigbird(config, head, h, seed);
        break;
      case SparsityMode::bslongformer:
        build_bslongformer(config, head);
        break;
      case SparsityMode::local_sliding_window:
        set_sliding_window(config, head, /*causal_window=*/config.unidirectional);
        break;
    }
  }
  // One layout for all heads: head 0's, copied (check_and_propagate_first_head_layout).
  for (int64_t h = built; h < num_heads; ++h) std::copy(data, data + nb * nb, data + h * nb * nb);
  return layout;
}

}  // namespace tessera
