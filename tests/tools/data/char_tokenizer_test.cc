#include "tools/data/char_tokenizer.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "core/json.h"
#include "tests/test_files.h"
#include "tests/testing.h"

using Catch::Matchers::Contains;
using tessera::data::CharTokenizer;
using tessera::testing::error_of;
using tessera::testing::fresh_dir;
using tessera::testing::write_bytes;

TEST_CASE("CharTokenizer's vocabulary is the sorted distinct bytes of the text", "[char]") {
  const CharTokenizer tok = CharTokenizer::from_text("hello world");
  CHECK(tok.chars() == std::vector<uint8_t>{' ', 'd', 'e', 'h', 'l', 'o', 'r', 'w'});
  CHECK(tok.vocab_size() == 8);
  CHECK(tok.type() == "char");
  CHECK_FALSE(tok.eot_token().has_value());
  CHECK(tok.encode("hello") == std::vector<int32_t>{3, 2, 4, 4, 5});
  const std::vector<int32_t> ids = tok.encode("world hello");
  CHECK(tok.decode(ids) == "world hello");
  CHECK(tok.encode("").empty());
}

TEST_CASE("CharTokenizer round-trips every byte value", "[char]") {
  std::string all;
  for (int b = 255; b >= 0; --b) all.push_back(static_cast<char>(b));
  const CharTokenizer tok = CharTokenizer::from_text(all);
  CHECK(tok.vocab_size() == 256);
  CHECK(tok.encode(all)[0] == 255);
  CHECK(tok.decode(tok.encode(all)) == all);
}

TEST_CASE("CharTokenizer names unknown bytes and ids with their positions", "[char]") {
  const CharTokenizer tok = CharTokenizer::from_text("hello world");
  CHECK(error_of([&] { tok.encode("hold!"); }) ==
        "[char_tokenizer] byte 0x21 ('!') at position 4 is not in the vocabulary of 8 characters");
  CHECK_THAT(error_of([&] { tok.encode("he\nl"); }), Contains("byte 0x0a at position 2"));
  CHECK(error_of([&] {
          tok.decode(std::vector<int32_t>{0, 8});
        }) == "[char_tokenizer] token id at position 1 expected in [0, 8), found 8");
  CHECK_THAT(error_of([] { CharTokenizer::from_text(""); }), Contains("non-empty"));
  CHECK_THAT(error_of([] {
               CharTokenizer(std::vector<uint8_t>{3, 2});
             }),
             Contains("strictly increasing"));
}

TEST_CASE("CharTokenizer saves and loads tokenizer.json", "[char]") {
  const auto dir = fresh_dir("char_tokenizer_file");
  const std::string path = (dir / tessera::data::kTokenizerFile).string();
  const CharTokenizer tok = CharTokenizer::from_text("First Citizen:\nBefore we proceed");
  tessera::data::save_tokenizer(tok, path);
  CHECK(tessera::parse_json_file(path) == tok.to_json());
  const auto loaded = tessera::data::load_tokenizer(path);
  CHECK(loaded->type() == "char");
  CHECK(loaded->vocab_size() == tok.vocab_size());
  CHECK(dynamic_cast<const CharTokenizer&>(*loaded).chars() == tok.chars());
  CHECK(loaded->decode(tok.encode("we proceed")) == "we proceed");
}

TEST_CASE("loading a char tokenizer.json is strict", "[char]") {
  const auto dir = fresh_dir("char_tokenizer_strict");
  const std::string p = (dir / "tokenizer.json").string();
  const auto load_error = [&](const std::string& text) {
    write_bytes(p, text);
    return error_of([&] { tessera::data::load_tokenizer(p); });
  };
  CHECK(load_error(R"({"type": "char", "chars": [10, 32], "extra": 1})") ==
        "[tokenizer] unknown key " + p + ": $.extra; valid keys: chars, type");
  CHECK_THAT(load_error(R"({"type": "char", "chars": [10, 256]})"),
             Contains(p + ": $.chars[1]: expected a byte value in [0, 255], found 256"));
  CHECK_THAT(load_error(R"({"type": "char", "chars": [32, 10]})"),
             Contains("$.chars[1]: expected strictly increasing byte values, found 10 after 32"));
  CHECK_THAT(load_error(R"({"type": "char", "chars": []})"),
             Contains("$.chars: expected at least one byte"));
  CHECK_THAT(load_error(R"({"type": "char"})"), Contains("$.chars: required key missing"));
  CHECK_THAT(load_error(R"({"type": "chars", "chars": [1]})"),
             Contains("$.type: expected one of \"char\", \"gpt2\", found string \"chars\""));
  CHECK_THAT(load_error(R"({"chars": [1]})"), Contains("$.type: required key missing"));
  CHECK_THAT(load_error(R"({"type": "char", "chars": [1], "chars": [2]})"),
             Contains("duplicate key"));
}
