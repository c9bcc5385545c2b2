#include "tools/data/pretokenize.h"

#include <cstddef>
#include <cstdint>

#include "tools/data/unicode.h"

namespace tessera::data {
namespace {

enum class CharClass { kLetter, kNumber, kSpace, kOther };

// One decoded character: a code point (or one invalid byte) and its length in bytes.
struct Char {
  char32_t cp = 0;
  size_t len = 0;  // 0 at the end of the text
  CharClass cls = CharClass::kOther;
};

bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// Decodes the character at `pos` (strict UTF-8: no overlong forms, surrogates or code
// points above U+10FFFF; anything else is one invalid byte).
Char char_at(std::string_view s, size_t pos) {
  Char c;
  if (pos >= s.size()) return c;
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + pos;
  const size_t left = s.size() - pos;
  const uint8_t b0 = p[0];
  size_t len = 1;
  char32_t cp = b0;
  uint8_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (b0 < 0x80) {
    len = 1;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    len = 0;  // a lone continuation byte, 0xC0, 0xC1 or 0xF5..0xFF
  }
  bool valid = len > 0 && len <= left;
  if (valid && len > 1) valid = p[1] >= lo && p[1] <= hi;
  for (size_t k = 1; valid && k < len; ++k) {
    valid = is_continuation(p[k]);
    cp = (cp << 6) | (p[k] & 0x3F);
  }
  if (!valid) {
    c.cp = b0;
    c.len = 1;
    c.cls = CharClass::kOther;
    return c;
  }
  c.cp = cp;
  c.len = len;
  if (is_whitespace(cp)) {
    c.cls = CharClass::kSpace;
  } else if (is_letter(cp)) {
    c.cls = CharClass::kLetter;
  } else if (is_number(cp)) {
    c.cls = CharClass::kNumber;
  }
  return c;
}

// The length of the contraction ('s 't 're 've 'm 'll 'd) at `pos`, or 0.
size_t contraction_at(std::string_view s, size_t pos) {
  if (s[pos] != '\'' || pos + 1 >= s.size()) return 0;
  const char a = s[pos + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (pos + 2 >= s.size()) return 0;
  const char b = s[pos + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// The end of the run of characters of class `cls` that starts at `pos`.
size_t run_end(std::string_view s, size_t pos, CharClass cls) {
  for (Char c = char_at(s, pos); c.len > 0 && c.cls == cls; c = char_at(s, pos)) pos += c.len;
  return pos;
}

// The length of the chunk that starts at `pos` (< s.size()).
size_t chunk_at(std::string_view s, size_t pos) {
  if (const size_t n = contraction_at(s, pos)) return n;
  const Char first = char_at(s, pos);
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional space, then a run of one
  // class; the space is taken when the run can follow it.
  size_t start = pos;
  Char c = first;
  if (first.cp == U' ') {
    const Char next = char_at(s, pos + 1);
    if (next.len > 0 && next.cls != CharClass::kSpace) {
      start = pos + 1;
      c = next;
    }
  }
  if (c.cls != CharClass::kSpace) return run_end(s, start, c.cls) - pos;
  // '\s+(?!\S)': the whitespace run, less its last character when a non-space follows
  // (that character then leads the next chunk); '\s+' when the run is one character.
  size_t end = pos;
  size_t last = pos;  // start of the run's last character
  for (Char w = first; w.len > 0 && w.cls == CharClass::kSpace; w = char_at(s, end)) {
    last = end;
    end += w.len;
  }
  if (end == s.size() || last == pos) return end - pos;
  return last - pos;
}

}  // namespace

void for_each_pretoken(std::string_view text, const std::function<void(std::string_view)>& fn) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t n = chunk_at(text, pos);
    fn(text.substr(pos, n));
    pos += n;
  }
}

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string_view> chunks;
  for_each_pretoken(text, [&](std::string_view chunk) { chunks.push_back(chunk); });
  return chunks;
}

}  // namespace tessera::data
