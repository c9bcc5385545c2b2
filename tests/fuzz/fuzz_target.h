// A reader under fuzzing: tests/fuzz/fuzz_main.cc feeds it its seed corpus and mutants.
//
// Note [Reader fuzzing]
// Every reader of user-supplied bytes (configs, safetensors files, token shards,
// tokenizer.json, checkpoint manifests and state) promises that bad input is a
// tessera::Error with a one-line message, never a crash, a hang, another exception type
// or unbounded memory. A fuzz test checks that promise on its committed seed corpus
// (tests/fuzz/corpus/<target>/, valid files and every input that once failed) and then on
// mutants of it for a bounded time: bit flips, interesting bytes and numbers, tokens of
// the target's dictionary, deleted, repeated and spliced ranges. The mutation stream is a
// fixed function of the corpus, so a failure found once is found again. The input being
// read is kept in the test's undeclared outputs (<target>.current), so a crash (and under
// --config=asan, a sanitizer report) leaves the input that caused it; add it to the corpus
// as crash-<what> with the fix. GCC has no -fsanitize=fuzzer, so this is a mutation loop
// of its own rather than libFuzzer's coverage-guided search.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace tessera::fuzz {

struct FuzzTarget {
  // Tokens the mutator inserts: the format's keys and values.
  std::vector<std::string> dictionary;
  // Reads `input` as the format; throws tessera::Error to reject it.
  std::function<void(const std::string& input)> read;
};

// Defined by each target: the reader, with any files it needs set up under `work_dir`.
FuzzTarget make_fuzz_target(const std::filesystem::path& work_dir);

}  // namespace tessera::fuzz
