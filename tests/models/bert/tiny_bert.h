// The tiny BERT the model tests build.
#pragma once

#include <cstdint>

#include "models/bert/config.h"

namespace tessera::testing {

// 2 layers, 2 heads, width 16, MLP 64, 37 tokens (+ [MASK], padded to 128), no dropout.
inline BertConfig tiny_bert(int64_t block_size) {
  BertConfig c;
  c.vocab_size = 37;
  c.block_size = block_size;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.dropout = 0.0;
  return c;
}

}  // namespace tessera::testing
