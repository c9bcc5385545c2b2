#include "tools/data/gpt2_bpe.h"

#include <catch2/catch.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "tests/test_files.h"
#include "tests/testing.h"

using Catch::Matchers::Contains;
using tessera::data::gpt2_byte_encoder;
using tessera::data::Gpt2Bpe;
using tessera::testing::error_of;
using tessera::testing::fresh_dir;
using tessera::testing::write_bytes;
using Ids = std::vector<int32_t>;

namespace {

// The UTF-8 of the character that stands for byte `b` in the BPE files.
std::string byte_char(int b) {
  const char32_t cp = gpt2_byte_encoder()[b];
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

// A small BPE: byte b is token b, then "Ġt" 256, "he" 257, "Ġthe" 258, "aa" 259, "th" 260,
// "<|endoftext|>" 261. Merges by rank: "Ġ t", "h e", "Ġt he", "a a", "t h".
nlohmann::json fixture_encoder() {
  nlohmann::json enc = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) enc[byte_char(b)] = b;
  const std::string G = byte_char(' ');
  int id = 256;
  for (const std::string& t : {G + "t", std::string("he"), G + "the", std::string("aa"),
                               std::string("th"), std::string("<|endoftext|>")}) {
    enc[t] = id++;
  }
  return enc;
}
std::string fixture_merges() {
  const std::string G = byte_char(' ');
  return "#version: 0.2\n" + G + " t\nh e\n" + G + "t he\na a\nt h\n";
}

// Writes encoder.json and vocab.bpe into a fresh directory named `name`.
std::string write_fixture(const std::string& name, const std::string& encoder,
                          const std::string& merges) {
  const auto dir = fresh_dir(name);
  write_bytes(dir / "encoder.json", encoder);
  write_bytes(dir / "vocab.bpe", merges);
  return dir.string();
}

// The real GPT-2 tables, loaded once; nullptr (with a warning) when they are not installed.
const Gpt2Bpe* real_bpe() {
  static const std::unique_ptr<Gpt2Bpe> bpe = []() -> std::unique_ptr<Gpt2Bpe> {
    const std::string dir = Gpt2Bpe::default_dir();
    if (!Gpt2Bpe::files_present(dir)) return nullptr;
    return std::make_unique<Gpt2Bpe>(Gpt2Bpe::from_dir(dir));
  }();
  if (bpe == nullptr) {
    WARN("GPT-2 BPE files not found in \"" << Gpt2Bpe::default_dir()
                                           << "\" (run tools/setup.sh); skipping");
  }
  return bpe.get();
}

std::string random_bytes(std::mt19937& rng, int max_len) {
  std::string s;
  const int n = static_cast<int>(rng() % (max_len + 1));
  const std::string common = " \n'ehtaHs0.\xc3\xa9";
  for (int i = 0; i < n; ++i) {
    s.push_back(rng() % 2 ? static_cast<char>(rng() % 256) : common[rng() % common.size()]);
  }
  return s;
}

}  // namespace

TEST_CASE("gpt2_byte_encoder is GPT-2's bytes_to_unicode", "[gpt2_bpe]") {
  const auto& e = gpt2_byte_encoder();
  CHECK(e['!'] == U'!');
  CHECK(e['~'] == U'~');
  CHECK(e[0xA1] == 0xA1);
  CHECK(e[0xFF] == 0xFF);
  CHECK(e[0] == 0x100);
  CHECK(e[' '] == 0x120);   // 'Ġ'
  CHECK(e['\n'] == 0x10A);  // 'Ċ'
  CHECK(e[0x7F] == 0x121);
  CHECK(e[0xAD] == 0x143);
}

TEST_CASE("Gpt2Bpe merges the lowest-ranked pair first, everywhere it occurs", "[gpt2_bpe]") {
  const std::string dir = write_fixture("bpe_fixture", fixture_encoder().dump(), fixture_merges());
  const Gpt2Bpe bpe = Gpt2Bpe::from_dir(dir);
  CHECK(bpe.vocab_size() == 262);
  CHECK(bpe.num_merges() == 5);
  CHECK(bpe.eot_token() == 261);
  CHECK(bpe.token_bytes(258) == " the");
  CHECK(bpe.token_bytes(261) == "<|endoftext|>");
  CHECK(bpe.encode(" the") == Ids{258});
  CHECK(bpe.encode("the") == Ids{'t', 257});  // "h e" outranks "t h"
  CHECK(bpe.encode(" th") == Ids{256, 'h'});
  CHECK(bpe.encode("aaa") == Ids{259, 'a'});  // left to right, no overlap
  CHECK(bpe.encode("aaaa") == Ids{259, 259});
  CHECK(bpe.encode("hehe the the") == Ids{257, 257, 258, 258});  // the second " the" is cached
  CHECK(bpe.decode(Ids{257, 258, 0, 255}) == std::string("he the\x00\xff", 8));
  CHECK(error_of([&] {
          bpe.decode(Ids{1, 262});
        }) == "[gpt2_bpe] token id at position 1 expected in [0, 262), found 262");

  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const std::string s = random_bytes(rng, 48);
    REQUIRE(bpe.decode(bpe.encode(s)) == s);
  }
}

TEST_CASE("Gpt2Bpe names the file and what is wrong with it", "[gpt2_bpe]") {
  const std::string merges = fixture_merges();
  const std::string encoder = fixture_encoder().dump();
  const auto load_error = [](const std::string& name, const std::string& enc,
                             const std::string& bpe) {
    const std::string dir = write_fixture(name, enc, bpe);
    return error_of([&] { Gpt2Bpe::from_dir(dir); });
  };

  const auto empty = fresh_dir("bpe_missing");
  CHECK_THAT(
      error_of([&] { Gpt2Bpe::from_dir(empty.string()); }),
      Contains("cannot open \"" + (empty / "encoder.json").string()) && Contains("tools/setup.sh"));

  CHECK_THAT(load_error("bpe_not_object", "[1, 2]", merges),
             Contains("encoder.json\": expected a non-empty JSON object from token to id, found "
                      "array"));
  CHECK_THAT(load_error("bpe_syntax", "{\"a\": 1,}", merges), Contains("encoder.json"));

  nlohmann::json enc = fixture_encoder();
  enc["he"] = "x";
  CHECK_THAT(load_error("bpe_bad_id", enc.dump(), merges),
             Contains("token \"he\" expected an integer id in [0, 262), found string \"x\""));
  enc = fixture_encoder();
  enc["he"] = 256;
  CHECK_THAT(load_error("bpe_dup_id", enc.dump(), merges),
             Contains("expected unique ids, found id 256 for both"));
  enc = fixture_encoder();
  enc.erase("<|endoftext|>");
  enc["\u65e5"] = 261;
  CHECK_THAT(load_error("bpe_non_byte", enc.dump(), merges),
             Contains("token \"\u65e5\" expected only byte characters, found U+65E5"));
  enc = fixture_encoder();
  enc.erase("<|endoftext|>");
  CHECK_THAT(load_error("bpe_no_eot", enc.dump(), merges),
             Contains("expected the token \"<|endoftext|>\", found none"));
  enc = fixture_encoder();
  enc.erase(byte_char('q'));
  enc["<|endoftext|>"] = 'q';
  CHECK_THAT(load_error("bpe_no_byte", enc.dump(), merges),
             Contains("expected a token for byte 113 (\"q\"), found none"));

  CHECK_THAT(load_error("bpe_bad_line", encoder, merges + "abc\n"),
             Contains("vocab.bpe\" line 7: expected \"left right\", found \"abc\""));
  CHECK_THAT(load_error("bpe_unknown_part", encoder, merges + "t hex\n"),
             Contains("line 7: expected a token of encoder.json, found \"hex\""));
  CHECK_THAT(load_error("bpe_unknown_merge", encoder, merges + "x y\n"),
             Contains("line 7: expected the merged token \"xy\" in encoder.json, found none"));
  CHECK_THAT(load_error("bpe_dup_merge", encoder, merges + "h e\n"),
             Contains("line 7: expected each pair once, found \"h e\" again (first at line 3)"));
  CHECK_THAT(load_error("bpe_blank_line", encoder, merges + "\nh e\n"),
             Contains("line 7: expected \"left right\", found \"\""));
}

TEST_CASE("Gpt2Bpe's tokenizer.json is checked against the BPE files", "[gpt2_bpe]") {
  const std::string dir = write_fixture("bpe_json", fixture_encoder().dump(), fixture_merges());
  const Gpt2Bpe bpe = Gpt2Bpe::from_dir(dir);
  const std::string path = dir + "/tokenizer.json";
  tessera::data::save_tokenizer(bpe, path);
  const auto loaded = tessera::data::load_tokenizer(path, dir);
  CHECK(loaded->type() == "gpt2");
  CHECK(loaded->vocab_size() == 262);
  CHECK(loaded->encode(" the") == Ids{258});
  write_bytes(path, R"({"type": "gpt2", "vocab_size": 50257, "eot_token": 261})");
  CHECK_THAT(error_of([&] { tessera::data::load_tokenizer(path, dir); }),
             Contains("$.vocab_size: expected the vocabulary size of the BPE files") &&
                 Contains("262, found 50257"));
  write_bytes(path, R"({"type": "gpt2", "vocab_size": 262})");
  CHECK_THAT(error_of([&] { tessera::data::load_tokenizer(path, dir); }),
             Contains("$.eot_token: required key missing"));
}

// Expected ids from OpenAI's GPT-2 encoder (Python, `regex` module), cross-checked with the
// gpt-3-encoder npm package.
TEST_CASE("Gpt2Bpe reproduces GPT-2's tokenization", "[gpt2_bpe]") {
  const Gpt2Bpe* bpe = real_bpe();
  if (bpe == nullptr) return;
  CHECK(bpe->vocab_size() == 50257);
  CHECK(bpe->num_merges() == 50000);
  CHECK(bpe->eot_token() == 50256);
  CHECK(bpe->token_bytes(50256) == "<|endoftext|>");

  CHECK(bpe->encode("Hello world") == Ids{15496, 995});
  CHECK(bpe->encode("Hello, world! How's it going? I'm fine, they'll say we'd've done it.") ==
        Ids{15496, 11, 995, 0,    1374, 338, 340,  1016, 30,   314, 1101,
            3734,  11, 484, 1183, 910,  356, 1549, 1053, 1760, 340, 13});
  CHECK(bpe->encode("Numbers: 12345 3.14159 and 2024-05-20, 1,000,000.") ==
        Ids{49601, 25, 17031, 2231, 513, 13, 1415, 19707, 290, 48609, 12,
            2713,  12, 1238,  11,   352, 11, 830,  11,    830, 13});
  CHECK(bpe->encode("multiple   spaces    here  ") ==
        Ids{48101, 220, 220, 9029, 220, 220, 220, 994, 220, 220});
  CHECK(bpe->encode("line one\nline two\n\n\nline five\r\n\tindented") ==
        Ids{1370, 530, 198, 1370, 734, 628, 198, 1370, 1936, 201, 198, 197, 521, 4714});
  CHECK(bpe->encode("na\u00efve caf\u00e9 \u65e5\u672c\u8a9e \U0001F642") ==
        Ids{2616, 38776, 40304, 10545, 245, 98, 17312, 105, 45739, 252, 32485});
  CHECK(bpe->encode("  leading spaces and trailing\n") == Ids{220, 3756, 9029, 290, 25462, 198});
  CHECK(bpe->encode("<|endoftext|> is text here") ==
        Ids{27, 91, 437, 1659, 5239, 91, 29, 318, 2420, 994});
  CHECK(bpe->encode("DON'T 'S 'Tis 'twas ''s !'s") ==
        Ids{41173, 6, 51, 705, 50, 705, 51, 271, 705, 4246, 292, 10148, 82, 5145, 6, 82});
  CHECK(bpe->encode("x\u00a0y\u2003z \u3000w") ==
        Ids{87, 1849, 88, 447, 225, 89, 220, 5099, 222, 86});
  CHECK(bpe->encode("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\n"
                    "Speak, speak.\n") == Ids{5962, 22307, 25,  198,  8421, 356, 5120, 597,  2252,
                                              11,   3285,  502, 2740, 13,   198, 198,  3237, 25,
                                              198,  5248,  461, 11,   2740, 13,  198});
  CHECK(bpe->encode("\u216b \u00bd \u0663 abc\u0661\u0662\u0663") ==
        Ids{158, 227, 104, 25208, 18923, 96, 450, 66, 149, 94, 149, 95, 149, 96});
  CHECK(bpe->encode("").empty());
  CHECK(bpe->decode(Ids{15496, 995, 50256}) == "Hello world<|endoftext|>");
}

TEST_CASE("Gpt2Bpe round-trips random bytes, invalid UTF-8 included", "[gpt2_bpe]") {
  const Gpt2Bpe* bpe = real_bpe();
  if (bpe == nullptr) return;
  std::mt19937 rng(11);
  for (int trial = 0; trial < 500; ++trial) {
    const std::string s = random_bytes(rng, 64);
    const Ids ids = bpe->encode(s);
    for (int32_t id : ids) REQUIRE((id >= 0 && id < 50256));
    REQUIRE(bpe->decode(ids) == s);
  }
}
