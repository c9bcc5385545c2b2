#include "tools/data/prepare.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/test_files.h"
#include "tests/testing.h"
#include "tools/data/char_tokenizer.h"
#include "tools/data/gpt2_bpe.h"
#include "tools/data/shard.h"

using Catch::Matchers::Contains;
using tessera::data::prepare_dataset;
using tessera::data::PrepareOptions;
using tessera::data::TokenShard;
using tessera::testing::error_of;
using tessera::testing::fresh_dir;
using tessera::testing::write_bytes;
namespace fs = std::filesystem;

namespace {

std::string sample_text() {
  std::string text;
  for (int i = 0; i < 40; ++i) {
    text +=
        "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, "
        "speak. " +
        std::to_string(i) + "\n";
  }
  return text;
}

// The token ids of the shards <dir>/<split>_*.bin, concatenated, and the shard sizes.
std::vector<int32_t> read_split(const fs::path& dir, const std::string& split,
                                std::vector<int64_t>* sizes = nullptr) {
  std::vector<int32_t> ids;
  for (int s = 0;; ++s) {
    char name[32];
    std::snprintf(name, sizeof(name), "%s_%06d.bin", split.c_str(), s);
    if (!fs::exists(dir / name)) break;
    const TokenShard shard((dir / name).string());
    ids.insert(ids.end(), shard.data(), shard.data() + shard.size());
    if (sizes != nullptr) sizes->push_back(shard.size());
  }
  return ids;
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("prepare_dataset writes char shards that decode to the text", "[prepare]") {
  const fs::path root = fresh_dir("prepare_char");
  const std::string text = sample_text();
  write_bytes(root / "input.txt", text);
  PrepareOptions o;
  o.input = (root / "input.txt").string();
  o.output = (root / "out").string();
  o.tokenizer = "char";
  const auto r = prepare_dataset(o);
  CHECK(r.input_bytes == static_cast<int64_t>(text.size()));
  const size_t cut = static_cast<size_t>(text.size() * 0.9);
  CHECK(r.train_tokens == static_cast<int64_t>(cut));
  CHECK(r.train_tokens + r.val_tokens == r.input_bytes);
  CHECK(names_in(root / "out") ==
        std::vector<std::string>{"tokenizer.json", "train_000000.bin", "val_000000.bin"});
  CHECK(r.files.size() == 3);

  const auto tok = tessera::data::load_tokenizer((root / "out" / "tokenizer.json").string());
  CHECK(tok->type() == "char");
  CHECK(tok->vocab_size() == r.vocab_size);
  CHECK(tok->decode(read_split(root / "out", "train")) == text.substr(0, cut));
  CHECK(tok->decode(read_split(root / "out", "val")) == text.substr(cut));
}

TEST_CASE("prepare_dataset splits into nearly equal shards and drops stale ones", "[prepare]") {
  const fs::path root = fresh_dir("prepare_shards");
  const std::string text = sample_text();
  write_bytes(root / "input.txt", text);
  PrepareOptions o;
  o.input = (root / "input.txt").string();
  o.output = (root / "out").string();
  o.tokenizer = "char";
  o.val_fraction = 0.25;
  o.shard_tokens = 300;
  prepare_dataset(o);
  std::vector<int64_t> sizes;
  const auto tok = tessera::data::load_tokenizer((root / "out" / "tokenizer.json").string());
  const size_t cut = static_cast<size_t>(text.size() * 0.75);
  CHECK(tok->decode(read_split(root / "out", "train", &sizes)) == text.substr(0, cut));
  CHECK(static_cast<int64_t>(sizes.size()) == (static_cast<int64_t>(cut) + 299) / 300);
  const auto [lo, hi] = std::minmax_element(sizes.begin(), sizes.end());
  CHECK(*hi - *lo <= 1);
  CHECK(*hi <= 300);
  CHECK(fs::exists(root / "out" / "val_000001.bin"));

  // A second run with bigger shards and no validation part leaves only its own files.
  write_bytes(root / "out" / "notes.txt", "kept");
  o.shard_tokens = 100000;
  o.val_fraction = 0;
  const auto r = prepare_dataset(o);
  CHECK(r.val_tokens == 0);
  CHECK(names_in(root / "out") ==
        std::vector<std::string>{"notes.txt", "tokenizer.json", "train_000000.bin"});
  CHECK(tok->decode(read_split(root / "out", "train")) == text);
}

TEST_CASE("prepare_dataset leaves nothing behind on error", "[prepare]") {
  const fs::path root = fresh_dir("prepare_errors");
  PrepareOptions o;
  o.input = (root / "missing.txt").string();
  o.output = (root / "out").string();
  o.tokenizer = "char";
  CHECK_THAT(error_of([&] { prepare_dataset(o); }), Contains("cannot open \"" + o.input + "\""));
  CHECK_FALSE(fs::exists(root / "out"));

  write_bytes(root / "empty.txt", "");
  o.input = (root / "empty.txt").string();
  CHECK_THAT(error_of([&] { prepare_dataset(o); }), Contains("expected text, found an empty file"));
  o.input = root.string();  // a directory, not an empty file
  CHECK(error_of([&] { prepare_dataset(o); }) ==
        "[prepare_data] \"" + root.string() + "\": expected a text file, found a directory");
  CHECK_FALSE(fs::exists(root / "out"));

  write_bytes(root / "input.txt", "some text");
  o.input = (root / "input.txt").string();
  o.tokenizer = "gpt2";
  o.bpe_dir = (root / "no_bpe").string();
  CHECK_THAT(error_of([&] { prepare_dataset(o); }), Contains("encoder.json"));
  CHECK_FALSE(fs::exists(root / "out"));

  o.tokenizer = "bytes";
  CHECK(error_of([&] { prepare_dataset(o); }) ==
        "[prepare_data] tokenizer expected \"char\" or \"gpt2\", found \"bytes\"");
  o.tokenizer = "char";
  o.val_fraction = 1.0;
  CHECK(error_of([&] { prepare_dataset(o); }) ==
        "[prepare_data] val fraction expected in [0, 1), found 1");

  // The output path is a file: nothing is created and the file is untouched.
  o.val_fraction = 0.1;
  write_bytes(root / "a_file", "x");
  o.output = (root / "a_file").string();
  CHECK_THAT(error_of([&] { prepare_dataset(o); }), Contains("a_file"));
  CHECK(tessera::testing::read_bytes(root / "a_file") == "x");
}

TEST_CASE("prepare_dataset with the gpt2 tokenizer", "[prepare]") {
  const std::string bpe_dir = tessera::data::Gpt2Bpe::default_dir();
  if (!tessera::data::Gpt2Bpe::files_present(bpe_dir)) {
    WARN("GPT-2 BPE files not found in \"" << bpe_dir << "\" (run tools/setup.sh); skipping");
    return;
  }
  const fs::path root = fresh_dir("prepare_gpt2");
  const std::string text = sample_text() + "na\u00efve caf\u00e9 \u65e5\u672c\u8a9e \U0001F642\n";
  write_bytes(root / "input.txt", text);
  PrepareOptions o;
  o.input = (root / "input.txt").string();
  o.output = (root / "out").string();
  o.tokenizer = "gpt2";
  o.val_fraction = 0.05;
  const auto r = prepare_dataset(o);
  CHECK(r.vocab_size == 50257);
  const auto tok = tessera::data::load_tokenizer((root / "out" / "tokenizer.json").string());
  CHECK(tok->type() == "gpt2");
  CHECK(tok->eot_token() == 50256);
  const std::vector<int32_t> train = read_split(root / "out", "train");
  const std::vector<int32_t> val = read_split(root / "out", "val");
  CHECK(static_cast<int64_t>(train.size()) == r.train_tokens);
  CHECK(tok->decode(train) + tok->decode(val) == text);
  CHECK(train[0] == 5962);  // "First"
}
