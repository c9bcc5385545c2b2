// generate: samples text from a training checkpoint or Hugging Face GPT-2 weights,
// streaming each token to stdout as it is drawn (models/gpt2/sampler.h, KV cache).
//
//   bazel run //tools:generate -- --checkpoint .runs/shakespeare_char/checkpoints --tokens 500
//   bazel run //tools:generate -- --weights gpt2/model.safetensors --prompt "Hello" --top-k 40
//
// Relative paths resolve against the directory the command was started from. Exit codes:
// 0 done, 2 bad flags, 1 any other error.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "models/gpt2/sampler.h"
#include "tools/cli/flags.h"
#include "tools/sampling/model_source.h"

namespace {

constexpr const char* kUsage =
    R"(usage: generate (--checkpoint PATH | --weights FILE) [options]

Samples text from a GPT and streams it to stdout (the prompt first); progress and
timing go to stderr.

  --checkpoint PATH   a checkpoint step directory, or a checkpoint root holding `latest`
  --weights FILE      Hugging Face GPT-2 weights (.safetensors)
  --model NAME        gpt2 | gpt2-medium | gpt2-large | gpt2-xl: the preset that gives
                      n_head when the weights' metadata lacks it (default: the preset of
                      the same depth and width)
  --tokenizer FILE    tokenizer.json (default: the checkpoint run config's data.tokenizer;
                      for --weights, the GPT-2 BPE from $TESSERA_GPT2_BPE_DIR or
                      ~/.cache/tessera/gpt2_bpe)
  --prompt TEXT       the text to continue (default "\n"); an empty prompt starts from
                      the end-of-text token where the tokenizer has one
  --tokens N          tokens to sample (default 200)
  --temperature T     softmax temperature; 0 is greedy (default 1.0)
  --top-k K           sample among the K most likely tokens; 0: all (default 0)
  --top-p P           sample among the smallest set with probability P; 1: all (default 1)
  --seed S            the draws are a function of the seed (default 1337)
  --threads N         threads; 0: all cores (default 0)
  --help              print this and exit
)";

int generate_main(int argc, char** argv) {
  using tessera::cli::Flag;
  using tessera::cli::UsageError;
  const tessera::cli::Flags flags(argc, argv,
                                  {{"checkpoint", Flag::kValue},
                                   {"weights", Flag::kValue},
                                   {"model", Flag::kValue},
                                   {"tokenizer", Flag::kValue},
                                   {"prompt", Flag::kValue},
                                   {"tokens", Flag::kValue},
                                   {"temperature", Flag::kValue},
                                   {"top-k", Flag::kValue},
                                   {"top-p", Flag::kValue},
                                   {"seed", Flag::kValue},
                                   {"threads", Flag::kValue}});
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (flags.has("checkpoint") == flags.has("weights")) {
    throw UsageError("expected exactly one of --checkpoint and --weights");
  }
  if (flags.has("model") && !flags.has("weights")) throw UsageError("--model needs --weights");
  const int64_t tokens = flags.get_int("tokens", 200);
  tessera::SamplingOptions options;
  options.temperature = flags.get_double("temperature", 1.0);
  options.top_k = flags.get_int("top-k", 0);
  options.top_p = flags.get_double("top-p", 1.0);
  const int64_t seed = flags.get_int("seed", 1337);
  const int64_t threads = flags.get_int("threads", 0);
  if (tokens < 0) throw UsageError("--tokens: expected an integer >= 0");
  if (!(options.temperature >= 0.0)) throw UsageError("--temperature: expected a number >= 0");
  if (options.top_k < 0) throw UsageError("--top-k: expected an integer >= 0");
  if (!(options.top_p > 0.0 && options.top_p <= 1.0)) {
    throw UsageError("--top-p: expected a number in (0, 1]");
  }
  if (seed < 0) throw UsageError("--seed: expected an integer >= 0");
  if (threads < 0) throw UsageError("--threads: expected an integer >= 0");
  options.seed = static_cast<uint64_t>(seed);
  const std::string prompt = flags.get("prompt", "\n");

  tessera::cli::enter_working_directory();
  if (threads > 0) tessera::set_num_threads(static_cast<int>(threads));

  const tessera::sampling::LoadedModel m =
      flags.has("checkpoint")
          ? tessera::sampling::load_from_checkpoint(flags.required("checkpoint"))
          : tessera::sampling::load_from_hf(flags.required("weights"), flags.get("model", ""));
  const std::unique_ptr<tessera::data::Tokenizer> tok =
      tessera::sampling::load_tokenizer_for(m, flags.get("tokenizer", ""));

  std::vector<int32_t> ids = tok->encode(prompt);
  if (ids.empty() && tok->eot_token()) ids.push_back(*tok->eot_token());
  if (ids.empty()) {
    throw std::runtime_error("the prompt is empty and the " + tok->type() +
                             " tokenizer has no end-of-text token; expected a non-empty --prompt");
  }

  std::fprintf(stderr, "generate: %s; %s tokenizer, %lld tokens\n", m.description.c_str(),
               tok->type().c_str(), static_cast<long long>(tok->vocab_size()));
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  // Ids the model knows but the tokenizer does not (a model vocab larger than the
  // tokenizer's) decode to nothing; they are counted and reported.
  int64_t unknown = 0;
  const auto start = std::chrono::steady_clock::now();
  tessera::sample(*m.model, ids, tokens, options, [&](int32_t id) {
    if (id >= tok->vocab_size()) {
      ++unknown;
      return;
    }
    // Token by token: a BPE token may hold part of a UTF-8 sequence; its bytes go out as
    // they are and the terminal joins them.
    const std::string bytes = tok->decode(std::span<const int32_t>(&id, 1));
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    std::fflush(stdout);
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (::isatty(STDOUT_FILENO)) std::fputc('\n', stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "generate: %lld tokens in %.2f s (%.1f tokens/s)\n",
               static_cast<long long>(tokens), seconds,
               seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0);
  if (unknown > 0) {
    std::fprintf(stderr,
                 "generate: %lld sampled ids are beyond the tokenizer's %lld tokens and were "
                 "not printed\n",
                 static_cast<long long>(unknown), static_cast<long long>(tok->vocab_size()));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::cli::run_tool("generate", kUsage, generate_main, argc, argv);
}
