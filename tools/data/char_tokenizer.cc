#include "tools/data/char_tokenizer.h"

#include <cctype>
#include <cstdio>
#include <utility>

#include "core/error.h"
#include "core/json.h"

namespace tessera::data {
namespace {

// "0x41 ('A')" for printable ASCII, "0x0a" otherwise.
std::string describe_byte(uint8_t b) {
  char hex[8];
  std::snprintf(hex, sizeof(hex), "0x%02x", b);
  if (b >= 0x20 && b < 0x7f) return str_cat(hex, " ('", static_cast<char>(b), "')");
  return hex;
}

}  // namespace

CharTokenizer CharTokenizer::from_text(std::string_view text) {
  TS_CHECK(!text.empty(), "[char_tokenizer] expected a non-empty training text, found 0 bytes");
  std::array<bool, 256> seen{};
  for (char c : text) seen[static_cast<uint8_t>(c)] = true;
  std::vector<uint8_t> chars;
  for (int b = 0; b < 256; ++b) {
    if (seen[b]) chars.push_back(static_cast<uint8_t>(b));
  }
  return CharTokenizer(std::move(chars));
}

CharTokenizer::CharTokenizer(std::vector<uint8_t> chars) : chars_(std::move(chars)) {
  TS_CHECK(!chars_.empty(), "[char_tokenizer] expected a non-empty vocabulary, found none");
  id_of_.fill(-1);
  for (size_t i = 0; i < chars_.size(); ++i) {
    TS_CHECK(i == 0 || chars_[i - 1] < chars_[i],
             "[char_tokenizer] expected strictly increasing bytes, found ", int(chars_[i]),
             " after ", int(chars_[i - 1]), " at index ", i);
    id_of_[chars_[i]] = static_cast<int32_t>(i);
  }
}

CharTokenizer CharTokenizer::from_json(const nlohmann::json& doc, const std::string& source) {
  JsonObjectReader r(doc, "tokenizer", str_cat(source, ": $"));
  r.required_one_of("type", {"char"});
  const std::vector<int64_t> values = r.required<std::vector<int64_t>>("chars");
  r.finish();
  const std::string path = r.key_path("chars");
  TS_CHECK(!values.empty(), "[tokenizer] ", path, ": expected at least one byte, found none");
  std::vector<uint8_t> chars;
  for (size_t i = 0; i < values.size(); ++i) {
    TS_CHECK(values[i] >= 0 && values[i] <= 255, "[tokenizer] ", path, "[", i,
             "]: expected a byte value in [0, 255], found ", values[i]);
    TS_CHECK(i == 0 || values[i - 1] < values[i], "[tokenizer] ", path, "[", i,
             "]: expected strictly increasing byte values, found ", values[i], " after ",
             values[i - 1]);
    chars.push_back(static_cast<uint8_t>(values[i]));
  }
  return CharTokenizer(std::move(chars));
}

std::vector<int32_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const uint8_t b = static_cast<uint8_t>(text[i]);
    ids[i] = id_of_[b];
    TS_CHECK(ids[i] >= 0, "[char_tokenizer] byte ", describe_byte(b), " at position ", i,
             " is not in the vocabulary of ", chars_.size(), " characters");
  }
  return ids;
}

std::string CharTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    TS_CHECK(ids[i] >= 0 && ids[i] < vocab_size(), "[char_tokenizer] token id at position ", i,
             " expected in [0, ", vocab_size(), "), found ", ids[i]);
    out[i] = static_cast<char>(chars_[ids[i]]);
  }
  return out;
}

nlohmann::json CharTokenizer::to_json() const {
  nlohmann::json chars = nlohmann::json::array();
  for (uint8_t b : chars_) chars.push_back(int(b));
  return {{"type", "char"}, {"chars", chars}};
}

}  // namespace tessera::data
