#include "tools/data/pretokenize.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "tools/data/unicode.h"

using tessera::data::gpt2_pretokenize;
using namespace std::string_literals;

namespace {

std::vector<std::string> chunks(std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view c : gpt2_pretokenize(text)) out.emplace_back(c);
  return out;
}

using V = std::vector<std::string>;

}  // namespace

// Expected chunks come from regex.findall with GPT-2's pattern in Python's `regex` module.
TEST_CASE("gpt2_pretokenize matches GPT-2's regex", "[pretokenize]") {
  CHECK(chunks("Hello world") == V{"Hello", " world"});
  CHECK(chunks("Hello, world! How's it going? I'm fine, they'll say we'd've done it.") ==
        V{"Hello", ",", " world", "!",   " How", "'s",  " it", " going", "?",     " I",  "'m",
          " fine", ",", " they",  "'ll", " say", " we", "'d",  "'ve",    " done", " it", "."});
  CHECK(chunks("Numbers: 12345 3.14159 and 2024-05-20, 1,000,000.") ==
        V{"Numbers", ":", " 12345", " 3", ".", "14159", " and", " 2024", "-", "05", "-", "20", ",",
          " 1", ",", "000", ",", "000", "."});
  CHECK(chunks("multiple   spaces    here  ") ==
        V{"multiple", "  ", " spaces", "   ", " here", "  "});
  CHECK(chunks("line one\nline two\n\n\nline five\r\n\tindented") ==
        V{"line", " one", "\n", "line", " two", "\n\n", "\n", "line", " five", "\r\n", "\t",
          "indented"});
  CHECK(chunks("na\u00efve caf\u00e9 \u65e5\u672c\u8a9e \U0001F642") ==
        V{"na\u00efve", " caf\u00e9", " \u65e5\u672c\u8a9e", " \U0001F642"});
  CHECK(chunks("DON'T 'S 'Tis 'twas ''s !'s") ==
        V{"DON", "'", "T", " '", "S", " '", "Tis", " '", "twas", " ''", "s", " !'", "s"});
  CHECK(chunks("x\u00a0y\u2003z \u3000w") ==
        V{"x", "\u00a0", "y", "\u2003", "z", " ", "\u3000", "w"});
  CHECK(chunks("a  \n  b") == V{"a", "  \n ", " b"});
  CHECK(chunks("\u216b \u00bd \u0663 abc\u0661\u0662\u0663") ==
        V{"\u216b", " \u00bd", " \u0663", " abc", "\u0661\u0662\u0663"});
  CHECK(chunks("<|endoftext|>") == V{"<|", "endoftext", "|>"});
  CHECK(chunks("").empty());
  CHECK(chunks(" ") == V{" "});
  CHECK(chunks("\x1c\x00x"s) == V{"\x1c\x00"s, "x"});  // U+001C is not White_Space
}

TEST_CASE("gpt2_pretokenize takes invalid UTF-8 bytes as symbols", "[pretokenize]") {
  CHECK(chunks("ab\xff\xfe cd\x80") == V{"ab", "\xff\xfe", " cd", "\x80"});
  // A truncated 3-byte sequence, an overlong 'A', a surrogate and a code point > U+10FFFF.
  CHECK(chunks("\xe6\x97x") == V{"\xe6\x97", "x"});
  CHECK(chunks("\xc1\x81 \xed\xa0\x80 \xf4\x90\x80\x80") ==
        V{"\xc1\x81", " \xed\xa0\x80", " \xf4\x90\x80\x80"});
}

TEST_CASE("gpt2_pretokenize's chunks concatenate back to any byte string", "[pretokenize]") {
  std::mt19937 rng(7);
  const std::string alphabet = " \t\n'sre0123abcXYZ.,!\xc3\xa9\xe6\x97\xa5\xf0\x9f\x99\x82\xff";
  for (int trial = 0; trial < 500; ++trial) {
    std::string s;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      s.push_back(rng() % 4 == 0 ? static_cast<char>(rng() % 256)
                                 : alphabet[rng() % alphabet.size()]);
    }
    std::string joined;
    for (std::string_view c : gpt2_pretokenize(s)) {
      REQUIRE_FALSE(c.empty());
      joined += c;
    }
    REQUIRE(joined == s);
  }
}

TEST_CASE("Unicode classes follow the generated tables", "[pretokenize]") {
  using namespace tessera::data;
  CHECK(std::string(kUnicodeVersion) == "14.0.0");
  CHECK(is_letter(U'A'));
  CHECK(is_letter(U'\u00e9'));
  CHECK(is_letter(U'\u65e5'));
  CHECK_FALSE(is_letter(U'1'));
  CHECK_FALSE(is_letter(U'\U0001F642'));
  CHECK(is_number(U'7'));
  CHECK(is_number(U'\u00bd'));  // No
  CHECK(is_number(U'\u216b'));  // Nl
  CHECK(is_number(U'\u0663'));  // Nd
  CHECK_FALSE(is_number(U'x'));
  CHECK(is_whitespace(U'\u3000'));
  CHECK(is_whitespace(U'\u0085'));
  CHECK_FALSE(is_whitespace(U'\u001c'));
  CHECK_FALSE(is_whitespace(U'\u200b'));
  CHECK_FALSE(is_letter(0x10FFFF));
}
