// Turning a raw text file into a prepared data directory (what tools/prepare_data runs).
//
// The text is split as nanoGPT does: the first (1 - val_fraction) of its bytes are the
// training text and the rest the validation text (the cut moved forward to a UTF-8
// character boundary). Each part is tokenized and written as llm.c token shards:
//   DIR/train_000000.bin, DIR/train_000001.bin, ...   the training tokens
//   DIR/val_000000.bin, ...                           the validation tokens (none when
//                                                     val_fraction is 0)
//   DIR/tokenizer.json                                how to decode them (tokenizer.h)
// A part of n tokens becomes ceil(n / shard_tokens) shards of nearly equal size (they
// differ by at most one token), so that no shard is much smaller than the others.
//
// The char tokenizer's vocabulary is the distinct bytes of the whole input file, so the
// validation text always encodes. The gpt2 tokenizer adds no end-of-text tokens.
//
// Nothing is left half-written: all files are first written into a staging directory
// inside DIR and then renamed into place; on error the staging directory is removed (and
// DIR too when this call created it). Shards of an earlier run beyond the ones written
// now (train_/val_ followed by six digits and .bin) are removed, so that a loader's glob
// sees only this run's data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::data {

struct PrepareOptions {
  std::string input;          // the text file
  std::string output;         // the data directory (created when missing)
  std::string tokenizer;      // "char" or "gpt2"
  std::string bpe_dir;        // gpt2: where encoder.json and vocab.bpe are; default when empty
  double val_fraction = 0.1;  // in [0, 1)
  int64_t shard_tokens = 100000000;  // the most tokens per shard; >= 1
};

struct PrepareResult {
  int64_t input_bytes = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int64_t vocab_size = 0;
  std::vector<std::string> files;  // every file written, in the order written
};

// Prepares `options.output` from `options.input`; see the file comment. Throws
// tessera::Error for invalid options, an unreadable or empty input, an empty training part,
// a tokenizer whose vocabulary does not fit uint16 tokens, and any write failure.
PrepareResult prepare_dataset(const PrepareOptions& options);

}  // namespace tessera::data
