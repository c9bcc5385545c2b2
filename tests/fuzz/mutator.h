// The mutations of Note [Reader fuzzing] (tests/fuzz/fuzz_target.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::fuzz {

class Mutator {
 public:
  // Mutants of `seeds`, with `dictionary` tokens, from a stream fixed by `seed`.
  Mutator(std::vector<std::string> seeds, std::vector<std::string> dictionary, uint64_t seed);

  // The next mutant: a seed with 1 to 4 mutations, at most kMaxBytes long.
  std::string next();

  static constexpr size_t kMaxBytes = 1 << 20;

 private:
  uint64_t random();  // SplitMix64
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(random() % n); }
  void mutate(std::string& s);

  std::vector<std::string> seeds_;
  std::vector<std::string> dictionary_;
  uint64_t state_;
};

}  // namespace tessera::fuzz
