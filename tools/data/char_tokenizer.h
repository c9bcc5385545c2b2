// A byte-level tokenizer in the manner of nanoGPT's shakespeare_char: the vocabulary is
// the sorted set of distinct bytes of the training text, and token id i is the i-th of
// them.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tools/data/tokenizer.h"

namespace tessera::data {

class CharTokenizer : public Tokenizer {
 public:
  // The tokenizer whose vocabulary is the distinct bytes of `text` (which must be
  // non-empty), in increasing order.
  static CharTokenizer from_text(std::string_view text);
  // The tokenizer over `chars`: non-empty and strictly increasing.
  explicit CharTokenizer(std::vector<uint8_t> chars);
  // Reads the description {"type": "char", "chars": [...]} strictly: unknown keys, a byte
  // outside [0, 255], and chars that are not strictly increasing are errors naming the
  // JSON path inside `source`.
  static CharTokenizer from_json(const nlohmann::json& doc, const std::string& source);

  // The vocabulary: token id i stands for byte chars()[i].
  const std::vector<uint8_t>& chars() const { return chars_; }

  std::string type() const override { return "char"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(chars_.size()); }
  std::optional<int32_t> eot_token() const override { return std::nullopt; }
  // Throws for the first byte not in the vocabulary, naming the byte and its position.
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  nlohmann::json to_json() const override;

 private:
  std::vector<uint8_t> chars_;
  std::array<int32_t, 256> id_of_{};  // byte -> token id, -1 when absent
};

}  // namespace tessera::data
