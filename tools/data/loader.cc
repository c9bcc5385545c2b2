#include "tools/data/loader.h"

#include <glob.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "core/error.h"
#include "core/factories.h"
#include "core/json.h"
#include "core/philox.h"

namespace tessera::data {

nlohmann::json LoaderState::to_json() const {
  return {{"shard", shard}, {"position", position}, {"epoch", epoch}, {"step", step}};
}

LoaderState LoaderState::from_json(const nlohmann::json& doc, const std::string& source) {
  JsonObjectReader r(doc, "loader", str_cat(source, ": $"));
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  LoaderState s;
  s.shard = r.required_in_range<int64_t>("shard", 0, kMax);
  s.position = r.required_in_range<int64_t>("position", 0, kMax);
  s.epoch = r.required_in_range<int64_t>("epoch", 0, kMax);
  s.step = r.required_in_range<int64_t>("step", 0, kMax);
  r.finish();
  return s;
}

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  ::globfree(&g);
  TS_CHECK(rc == 0 || rc == GLOB_NOMATCH, "[loader] cannot expand \"", pattern,
           "\": ", rc == GLOB_NOSPACE ? "out of memory" : "read error");
  TS_CHECK(!paths.empty(), "[loader] expected at least one file matching \"", pattern,
           "\", found none");
  std::sort(paths.begin(), paths.end());
  return paths;
}

DataLoader::DataLoader(const std::string& pattern, const LoaderOptions& options)
    : DataLoader(expand_glob(pattern), options) {}

DataLoader::DataLoader(std::vector<std::string> paths, const LoaderOptions& options)
    : paths_(std::move(paths)), options_(options) {
  const LoaderOptions& o = options_;
  TS_CHECK(!paths_.empty(), "[loader] expected at least one shard, found none");
  TS_CHECK(o.batch_size >= 1, "[loader] batch_size expected >= 1, found ", o.batch_size);
  TS_CHECK(o.seq_len >= 1, "[loader] seq_len expected >= 1, found ", o.seq_len);
  TS_CHECK(o.world_size >= 1, "[loader] world_size expected >= 1, found ", o.world_size);
  TS_CHECK(o.rank >= 0 && o.rank < o.world_size, "[loader] rank expected in [0, ", o.world_size,
           "), found ", o.rank);
  TS_CHECK(o.vocab_size >= 1 && o.vocab_size <= 65536,
           "[loader] vocab_size expected in [1, 65536] (uint16 tokens), found ", o.vocab_size);
  // Fail now rather than hours into a run: every shard's header and size.
  for (const std::string& path : paths_) {
    const TokenShard shard(path);
    TS_CHECK(shard.size() >= min_shard_tokens(), "[loader] \"", path, "\": expected at least ",
             min_shard_tokens(), " tokens (B*T",
             o.mode == LoaderMode::kSequential ? "*world_size" : "", " + 1 with B=", o.batch_size,
             ", T=", o.seq_len,
             o.mode == LoaderMode::kSequential ? str_cat(", world_size=", o.world_size) : "",
             "), found ", shard.size());
  }
  open_shard(0);
}

int64_t DataLoader::min_shard_tokens() const {
  return (options_.mode == LoaderMode::kSequential ? group_tokens() : tokens_per_batch()) + 1;
}

bool DataLoader::group_fits() const {
  // Position 0 always fits: the constructor checked the shard's size, and in random mode a
  // shard smaller than a group still gives one batch.
  TS_INTERNAL_ASSERT(current_index_ == shard_);
  return position_ == 0 || position_ + group_tokens() + 1 <= current_->size();
}

void DataLoader::open_shard(int64_t index) {
  if (index == current_index_) return;
  current_.reset();
  current_index_ = -1;
  TokenShard shard(paths_[index]);
  // The file may have changed since the constructor looked at it.
  TS_CHECK(shard.size() >= min_shard_tokens(), "[loader] \"", shard.path(),
           "\": expected at least ", min_shard_tokens(), " tokens, found ", shard.size());
  shard.validate_vocab(options_.vocab_size);
  current_.emplace(std::move(shard));
  current_index_ = index;
}

void DataLoader::next_shard() {
  ++shard_;
  if (shard_ == static_cast<int64_t>(paths_.size())) {
    shard_ = 0;
    ++epoch_;
  }
  position_ = 0;
}

Batch DataLoader::next() {
  const int64_t B = options_.batch_size;
  const int64_t T = options_.seq_len;
  open_shard(shard_);  // a throw leaves the cursor as it was
  const uint16_t* tokens = current_->data();
  Batch batch{empty({B, T}, {DType::i32}), empty({B, T}, {DType::i32})};
  int32_t* inputs = batch.inputs.data_ptr<int32_t>();
  int32_t* targets = batch.targets.data_ptr<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    int64_t start;
    if (options_.mode == LoaderMode::kSequential) {
      start = position_ + options_.rank * tokens_per_batch() + b * T;
    } else {
      // The row's index in the group's batch: W ranks of B rows draw what one rank of W*B
      // rows draws.
      const uint64_t row = static_cast<uint64_t>(options_.rank * options_.batch_size + b);
      const auto w = philox4x32(static_cast<uint64_t>(step_), row, options_.seed);
      const uint64_t bits = (static_cast<uint64_t>(w[1]) << 32) | w[0];
      start = static_cast<int64_t>(bits % static_cast<uint64_t>(current_->size() - T));
    }
    TS_INTERNAL_ASSERT(start >= 0 && start + T + 1 <= current_->size());
    const uint16_t* row = tokens + start;
    for (int64_t t = 0; t < T; ++t) {
      inputs[b * T + t] = row[t];
      targets[b * T + t] = row[t + 1];
    }
  }
  ++step_;
  position_ += group_tokens();
  if (!group_fits()) next_shard();
  return batch;
}

LoaderState DataLoader::state() const { return {shard_, position_, epoch_, step_}; }

void DataLoader::restore(const LoaderState& state) {
  const int64_t n = static_cast<int64_t>(paths_.size());
  TS_CHECK(state.shard >= 0 && state.shard < n, "[loader] restore: shard expected in [0, ", n,
           "), found ", state.shard);
  TS_CHECK(state.position >= 0 && state.epoch >= 0 && state.step >= 0,
           "[loader] restore: position, epoch and step expected >= 0, found ", state.position, ", ",
           state.epoch, ", ", state.step);
  open_shard(state.shard);
  TS_CHECK(state.position <= current_->size(),
           "[loader] restore: position expected <= ", current_->size(), " (the tokens in \"",
           current_->path(), "\"), found ", state.position);
  shard_ = state.shard;
  position_ = state.position;
  epoch_ = state.epoch;
  step_ = state.step;
  if (!group_fits()) next_shard();
}

void DataLoader::reset() { restore(LoaderState{}); }

}  // namespace tessera::data
