// prepare_data: raw text -> llm.c token shards and tokenizer.json (tools/data/prepare.h).
//
//   prepare_data --input FILE --output DIR --tokenizer char|gpt2 [--bpe-dir DIR]
//                [--val-fraction 0.1] [--shard-tokens N]
//
// Exit codes: 0 on success, 2 for bad flags (one line and the usage), 1 for any other
// error (one line); on error nothing is left in DIR.
#include <algorithm>
#include <exception>
#include <iostream>
#include <iterator>
#include <map>
#include <string>

#include "core/error.h"
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

// A flag error: reported with the usage, exit code 2.
struct UsageError {
  std::string message;
};

double parse_double(const std::string& flag, const std::string& value) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size()) {
    throw UsageError{tessera::str_cat(flag, " expected a number, found \"", value, "\"")};
  }
  return v;
}

int64_t parse_int(const std::string& flag, const std::string& value) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size()) {
    throw UsageError{tessera::str_cat(flag, " expected an integer, found \"", value, "\"")};
  }
  return v;
}

// Reads --flag VALUE and --flag=VALUE pairs; returns false for --help.
bool parse_flags(int argc, char** argv, tessera::data::PrepareOptions& o) {
  std::map<std::string, std::string> values;
  const char* const known[] = {"--input",   "--output",       "--tokenizer",
                               "--bpe-dir", "--val-fraction", "--shard-tokens"};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") return false;
    std::string value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); arg.starts_with("--") && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    if (std::find(std::begin(known), std::end(known), arg) == std::end(known)) {
      throw UsageError{tessera::str_cat("unknown flag \"", arg, "\"")};
    }
    if (!has_value) {
      if (i + 1 >= argc) throw UsageError{tessera::str_cat(arg, " expected a value, found none")};
      value = argv[++i];
    }
    if (!values.emplace(arg, value).second) {
      throw UsageError{tessera::str_cat(arg, " given twice")};
    }
  }
  for (const char* required : {"--input", "--output", "--tokenizer"}) {
    if (!values.count(required)) throw UsageError{tessera::str_cat(required, " is required")};
  }
  o.input = values["--input"];
  o.output = values["--output"];
  o.tokenizer = values["--tokenizer"];
  if (o.tokenizer != "char" && o.tokenizer != "gpt2") {
    throw UsageError{
        tessera::str_cat("--tokenizer expected char or gpt2, found \"", o.tokenizer, "\"")};
  }
  if (values.count("--bpe-dir")) o.bpe_dir = values["--bpe-dir"];
  if (values.count("--val-fraction")) {
    o.val_fraction = parse_double("--val-fraction", values["--val-fraction"]);
    if (!(o.val_fraction >= 0 && o.val_fraction < 1)) {
      throw UsageError{tessera::str_cat("--val-fraction expected a number in [0, 1), found ",
                                        values["--val-fraction"])};
    }
  }
  if (values.count("--shard-tokens")) {
    o.shard_tokens = parse_int("--shard-tokens", values["--shard-tokens"]);
    if (o.shard_tokens < 1) {
      throw UsageError{
          tessera::str_cat("--shard-tokens expected an integer >= 1, found ", o.shard_tokens)};
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::data::PrepareOptions options;
  try {
    if (!parse_flags(argc, argv, options)) {
      std::cout << kUsage;
      return 0;
    }
  } catch (const UsageError& e) {
    std::cerr << "prepare_data: " << e.message << "\n" << kUsage;
    return 2;
  }
  try {
    const tessera::data::PrepareResult r = tessera::data::prepare_dataset(options);
    std::cout << "prepare_data: " << options.input << " (" << r.input_bytes << " bytes), tokenizer "
              << options.tokenizer << ", vocab size " << r.vocab_size << "\n"
              << "  train tokens: " << r.train_tokens << "\n"
              << "  val tokens:   " << r.val_tokens << "\n"
              << "  files:\n";
    for (const std::string& f : r.files) std::cout << "    " << f << "\n";
  } catch (const std::exception& e) {
    std::cerr << "prepare_data: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
