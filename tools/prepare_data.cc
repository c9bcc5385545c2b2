// prepare_data: raw text -> llm.c token shards and tokenizer.json (tools/data/prepare.h).
//
//   prepare_data --input FILE --output DIR --tokenizer char|gpt2 [--bpe-dir DIR]
//                [--val-fraction 0.1] [--shard-tokens N]
//
// Relative paths resolve against the directory the command was started from (also under
// `bazel run`). Exit codes: 0 on success, 2 for bad flags (one line and the usage), 1 for
// any other error (one line); on error nothing is left in DIR.

#include <cstdio>
#include <string>

#include "core/error.h"
#include "tools/cli/flags.h"
#include "tools/data/prepare.h"

namespace {

constexpr const char* kUsage =
    R"(usage: prepare_data --input FILE --output DIR --tokenizer char|gpt2 [options]

Tokenizes a text file into DIR/train_NNNNNN.bin, DIR/val_NNNNNN.bin (llm.c token shards)
and DIR/tokenizer.json. The last --val-fraction of the text is the validation part.

  --input FILE          the text to tokenize
  --output DIR          the data directory (created when missing)
  --tokenizer KIND      char (the distinct bytes of FILE) or gpt2 (GPT-2 byte-level BPE)
  --bpe-dir DIR         gpt2: the directory holding encoder.json and vocab.bpe
                        (default: $TESSERA_GPT2_BPE_DIR, else ~/.cache/tessera/gpt2_bpe)
  --val-fraction F      fraction of the text for validation, in [0, 1) (default 0.1)
  --shard-tokens N      the most tokens per shard (default 100000000)
  --help                print this and exit
)";

int prepare_main(int argc, char** argv) {
  using tessera::cli::Flag;
  using tessera::cli::UsageError;
  const tessera::cli::Flags flags(argc, argv,
                                  {{"input", Flag::kValue},
                                   {"output", Flag::kValue},
                                   {"tokenizer", Flag::kValue},
                                   {"bpe-dir", Flag::kValue},
                                   {"val-fraction", Flag::kValue},
                                   {"shard-tokens", Flag::kValue}});
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  tessera::data::PrepareOptions o;
  o.input = flags.required("input");
  o.output = flags.required("output");
  o.tokenizer = flags.required("tokenizer");
  if (o.tokenizer != "char" && o.tokenizer != "gpt2") {
    throw UsageError("--tokenizer expected char or gpt2, found \"" + o.tokenizer + "\"");
  }
  o.bpe_dir = flags.get("bpe-dir", "");
  o.val_fraction = flags.get_double("val-fraction", o.val_fraction);
  if (!(o.val_fraction >= 0 && o.val_fraction < 1)) {
    throw UsageError(
        tessera::str_cat("--val-fraction expected a number in [0, 1), found ", o.val_fraction));
  }
  o.shard_tokens = flags.get_int("shard-tokens", o.shard_tokens);
  if (o.shard_tokens < 1) {
    throw UsageError(
        tessera::str_cat("--shard-tokens expected an integer >= 1, found ", o.shard_tokens));
  }
  tessera::cli::enter_working_directory();
  const tessera::data::PrepareResult r = tessera::data::prepare_dataset(o);
  std::printf("prepare_data: %s (%lld bytes), tokenizer %s, vocab size %lld\n", o.input.c_str(),
              static_cast<long long>(r.input_bytes), o.tokenizer.c_str(),
              static_cast<long long>(r.vocab_size));
  std::printf("  train tokens: %lld\n  val tokens:   %lld\n  files:\n",
              static_cast<long long>(r.train_tokens), static_cast<long long>(r.val_tokens));
  for (const std::string& f : r.files) std::printf("    %s\n", f.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::cli::run_tool("prepare_data", kUsage, prepare_main, argc, argv);
}
