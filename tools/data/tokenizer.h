// The tokenizer interface, and the tokenizer.json file that records which tokenizer a
// prepared data directory was made with, so that the trainer and the generator decode
// with the same one.
//
// DIR/tokenizer.json is one of
//   {"type": "char", "chars": [10, 32, 33, ...]}           byte values, strictly increasing;
//                                                           token id i is chars[i]
//   {"type": "gpt2", "vocab_size": 50257, "eot_token": 50256}
// The gpt2 tokenizer's tables (encoder.json, vocab.bpe) are not copied into DIR: they are
// loaded from a BPE directory (Gpt2Bpe::default_dir()), and checked against the file.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::data {

// The name of the tokenizer description inside a prepared data directory.
inline constexpr const char* kTokenizerFile = "tokenizer.json";

// Text to token ids and back.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // The "type" in tokenizer.json: "char" or "gpt2".
  virtual std::string type() const = 0;
  // The number of token ids; every id is in [0, vocab_size()).
  virtual int64_t vocab_size() const = 0;
  // The end-of-text token, when the tokenizer has one.
  virtual std::optional<int32_t> eot_token() const = 0;
  // The token ids of `text` (raw bytes).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The bytes of `ids`; throws for an id outside [0, vocab_size()), naming it and its
  // position.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // The tokenizer.json description.
  virtual nlohmann::json to_json() const = 0;
};

// Writes tokenizer.to_json() to `path` atomically.
void save_tokenizer(const Tokenizer& tokenizer, const std::string& path);
// Reads the tokenizer described by the file at `path` (normally DIR/tokenizer.json). A gpt2
// tokenizer loads its tables from `bpe_dir` (Gpt2Bpe::default_dir() when empty). Throws,
// naming the file and the JSON path, for an unknown type, a malformed description, or
// tables that do not match it.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, const std::string& bpe_dir = "");

}  // namespace tessera::data
