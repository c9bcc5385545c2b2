#include "tests/fuzz/mutator.h"

#include <algorithm>
#include <array>
#include <utility>

namespace tessera::fuzz {
namespace {

// Bytes and numbers at the edges of what readers handle.
constexpr std::array<char, 12> kBytes = {'\0', '\xff', '\x7f', '\x80', '{', '}',
                                         '[',  ']',    '"',    '\\',   ',', '\n'};
const std::array<const char*, 16> kNumbers = {"0",
                                              "-1",
                                              "1",
                                              "255",
                                              "256",
                                              "65535",
                                              "65536",
                                              "2147483647",
                                              "2147483648",
                                              "4294967296",
                                              "9223372036854775807",
                                              "9223372036854775808",
                                              "18446744073709551616",
                                              "1e308",
                                              "1e999",
                                              "-0.0"};
// JSON structure, on top of each target's own words.
const std::array<const char*, 12> kJson = {
    "{", "}", "[", "]", ",", ":", "\"", "null", "true", "\"\\u0000\"", "[[[[[[[[[[[[", "{\"\":"};

}  // namespace

Mutator::Mutator(std::vector<std::string> seeds, std::vector<std::string> dictionary, uint64_t seed)
    : seeds_(std::move(seeds)), dictionary_(std::move(dictionary)), state_(seed) {
  for (const char* token : kJson) dictionary_.emplace_back(token);
  for (const char* number : kNumbers) dictionary_.emplace_back(number);
}

uint64_t Mutator::random() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::string Mutator::next() {
  std::string s = seeds_.empty() ? std::string() : seeds_[below(seeds_.size())];
  const size_t count = 1 + below(4);
  for (size_t i = 0; i < count; ++i) mutate(s);
  if (s.size() > kMaxBytes) s.resize(kMaxBytes);
  return s;
}

void Mutator::mutate(std::string& s) {
  const size_t at = below(s.size() + 1);
  switch (below(9)) {
    case 0:  // flip a bit
      if (!s.empty()) s[below(s.size())] ^= static_cast<char>(1 << below(8));
      break;
    case 1:  // an interesting byte
      if (!s.empty()) s[below(s.size())] = kBytes[below(kBytes.size())];
      break;
    case 2:  // insert a token
      s.insert(at, dictionary_[below(dictionary_.size())]);
      break;
    case 3: {  // delete a range
      const size_t n = std::min(s.size() - std::min(at, s.size()), 1 + below(16));
      s.erase(std::min(at, s.size()), n);
      break;
    }
    case 4: {  // repeat a range, up to 16 times
      if (s.empty()) break;
      const size_t begin = below(s.size());
      const std::string piece = s.substr(begin, 1 + below(std::min<size_t>(64, s.size() - begin)));
      std::string repeated;
      for (size_t i = 0, n = 1 + below(16); i < n; ++i) repeated += piece;
      s.insert(begin, repeated);
      break;
    }
    case 5:  // truncate
      s.resize(at);
      break;
    case 6: {  // splice another seed's tail
      if (seeds_.empty()) break;
      const std::string& other = seeds_[below(seeds_.size())];
      s = s.substr(0, at) + other.substr(below(other.size() + 1));
      break;
    }
    case 7: {  // replace a number with another
      const size_t digit = s.find_first_of("0123456789", at);
      if (digit == std::string::npos) break;
      const size_t end = s.find_first_not_of("0123456789", digit);
      s.replace(digit, (end == std::string::npos ? s.size() : end) - digit,
                kNumbers[below(kNumbers.size())]);
      break;
    }
    default: {  // overwrite with random bytes
      for (size_t i = at, n = std::min(s.size(), at + 1 + below(8)); i < n; ++i) {
        s[i] = static_cast<char>(random());
      }
      break;
    }
  }
}

}  // namespace tessera::fuzz
