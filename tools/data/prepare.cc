#include "tools/data/prepare.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <set>
#include <string_view>

#include "core/error.h"
#include "core/file_io.h"
#include "tools/data/char_tokenizer.h"
#include "tools/data/gpt2_bpe.h"
#include "tools/data/shard.h"

namespace tessera::data {
namespace fs = std::filesystem;
namespace {

// Removes the staging directory (and the output directory when this run created it and
// left it empty) unless released.
class Staging {
 public:
  Staging(fs::path dir, fs::path output, bool created_output)
      : dir_(std::move(dir)), output_(std::move(output)), created_output_(created_output) {}
  ~Staging() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    if (!released_ && created_output_) fs::remove(output_, ec);  // only if empty
  }
  const fs::path& dir() const { return dir_; }
  void release() { released_ = true; }

 private:
  fs::path dir_;
  fs::path output_;
  bool created_output_;
  bool released_ = false;
};

// Whether `name` is a shard name of ours: train_ or val_, six digits, .bin.
bool is_shard_name(std::string_view name) {
  for (std::string_view prefix : {"train_", "val_"}) {
    if (name.size() == prefix.size() + 10 && name.starts_with(prefix) && name.ends_with(".bin") &&
        std::all_of(name.begin() + prefix.size(), name.end() - 4,
                    [](char c) { return c >= '0' && c <= '9'; })) {
      return true;
    }
  }
  return false;
}

// Writes `ids` as ceil(n / shard_tokens) nearly equal shards named <split>_NNNNNN.bin into
// `dir`; returns the file names.
std::vector<std::string> write_split(const fs::path& dir, const std::string& split,
                                     const std::vector<int32_t>& ids, int64_t shard_tokens) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t shards = std::max<int64_t>(1, (n + shard_tokens - 1) / shard_tokens);
  std::vector<std::string> names;
  for (int64_t s = 0; s < shards; ++s) {
    const int64_t begin = n * s / shards;
    const int64_t end = n * (s + 1) / shards;
    std::vector<uint16_t> tokens(ids.begin() + begin, ids.begin() + end);
    char name[32];
    std::snprintf(name, sizeof(name), "%s_%06lld.bin", split.c_str(), static_cast<long long>(s));
    write_shard((dir / name).string(), tokens);
    names.push_back(name);
  }
  return names;
}

}  // namespace

PrepareResult prepare_dataset(const PrepareOptions& o) {
  TS_CHECK(o.tokenizer == "char" || o.tokenizer == "gpt2",
           "[prepare_data] tokenizer expected \"char\" or \"gpt2\", found \"", o.tokenizer, "\"");
  TS_CHECK(o.val_fraction >= 0.0 && o.val_fraction < 1.0,
           "[prepare_data] val fraction expected in [0, 1), found ", o.val_fraction);
  TS_CHECK(o.shard_tokens >= 1, "[prepare_data] shard tokens expected >= 1, found ",
           o.shard_tokens);
  TS_CHECK(o.shard_tokens <= std::numeric_limits<int32_t>::max(),
           "[prepare_data] shard tokens expected <= 2147483647, found ", o.shard_tokens);
  TS_CHECK(!o.output.empty(), "[prepare_data] expected an output directory, found \"\"");

  // Everything that can fail on the input happens before anything is written.
  const std::string text = read_whole_file(o.input, "prepare_data", "a text file");
  TS_CHECK(!text.empty(), "[prepare_data] \"", o.input, "\": expected text, found an empty file");
  size_t cut = static_cast<size_t>(static_cast<double>(text.size()) * (1.0 - o.val_fraction));
  while (cut < text.size() && (static_cast<uint8_t>(text[cut]) & 0xC0) == 0x80) ++cut;
  TS_CHECK(cut > 0, "[prepare_data] \"", o.input, "\": expected a non-empty training part, found ",
           "0 of ", text.size(), " bytes with val fraction ", o.val_fraction);
  std::unique_ptr<Tokenizer> tokenizer;
  if (o.tokenizer == "char") {
    tokenizer = std::make_unique<CharTokenizer>(CharTokenizer::from_text(text));
  } else {
    tokenizer = std::make_unique<Gpt2Bpe>(
        Gpt2Bpe::from_dir(o.bpe_dir.empty() ? Gpt2Bpe::default_dir() : o.bpe_dir));
  }
  TS_CHECK(tokenizer->vocab_size() <= 65536, "[prepare_data] vocabulary size expected <= 65536 ",
           "(uint16 shard tokens), found ", tokenizer->vocab_size());
  const std::string_view all(text);
  const std::vector<int32_t> train = tokenizer->encode(all.substr(0, cut));
  const std::vector<int32_t> val = tokenizer->encode(all.substr(cut));

  PrepareResult result;
  result.input_bytes = static_cast<int64_t>(text.size());
  result.train_tokens = static_cast<int64_t>(train.size());
  result.val_tokens = static_cast<int64_t>(val.size());
  result.vocab_size = tokenizer->vocab_size();

  const fs::path output(o.output);
  std::error_code ec;
  const bool created = fs::create_directories(output, ec);
  TS_CHECK(!ec, "[prepare_data] cannot create \"", o.output, "\": ", ec.message());
  TS_CHECK(fs::is_directory(output), "[prepare_data] \"", o.output,
           "\": expected a directory, found a file");
  const fs::path staging_dir = output / str_cat(".prepare_data.tmp.", ::getpid());
  fs::create_directory(staging_dir, ec);
  TS_CHECK(!ec, "[prepare_data] cannot create \"", staging_dir.string(), "\": ", ec.message());
  Staging staging(staging_dir, output, created);

  std::vector<std::string> names = write_split(staging.dir(), "train", train, o.shard_tokens);
  if (o.val_fraction > 0) {
    for (std::string& name : write_split(staging.dir(), "val", val, o.shard_tokens)) {
      names.push_back(std::move(name));
    }
  }
  save_tokenizer(*tokenizer, (staging.dir() / kTokenizerFile).string());
  names.push_back(kTokenizerFile);

  for (const std::string& name : names) {
    fs::rename(staging.dir() / name, output / name, ec);
    TS_CHECK(!ec, "[prepare_data] cannot move \"", name, "\" into \"", o.output,
             "\": ", ec.message());
    result.files.push_back((output / name).string());
  }
  // Shards of an earlier run that this run did not replace would join the new data.
  const std::set<std::string> written(names.begin(), names.end());
  for (const fs::directory_entry& entry : fs::directory_iterator(output)) {
    const std::string name = entry.path().filename().string();
    if (is_shard_name(name) && !written.count(name)) {
      fs::remove(entry.path(), ec);
      TS_CHECK(!ec, "[prepare_data] cannot remove the stale shard \"", entry.path().string(),
               "\": ", ec.message());
    }
  }
  staging.release();
  return result;
}

}  // namespace tessera::data
