// How a language model draws tokens when it generates text.
#pragma once

#include <cstdint>

namespace tessera {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy (argmax)
  int64_t top_k = 0;         // keep the k most likely tokens; 0: all
  double top_p = 1.0;        // keep the smallest set with this much probability; 1: all
  uint64_t seed = 0;         // the draws are a function of (seed, token index)
};

}  // namespace tessera
