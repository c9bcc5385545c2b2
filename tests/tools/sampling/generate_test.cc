// tools/generate and its loading library: a checkpoint written by CheckpointDir (found
// through `latest` or by its step directory) and Hugging Face safetensors give back the
// saved model, and the binary streams the tokens the sampler draws; bad flags exit 2,
// other errors exit 1 with one line.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/factories.h"
#include "core/grad_mode.h"
#include "models/gpt2/hf_weights.h"
#include "models/gpt2/sampler.h"
#include "models/io/safetensors.h"
#include "tests/test_files.h"
#include "tests/testing.h"
#include "tests/tiny_gpt.h"
#include "tools/data/char_tokenizer.h"
#include "tools/data/gpt2_bpe.h"
#include "tools/sampling/model_source.h"
#include "tools/trainer/checkpoint.h"

namespace tessera::sampling {
namespace {

namespace fs = std::filesystem;
using Catch::Contains;
using testing::error_of;
using testing::fresh_dir;
using testing::read_bytes;
using train::resolve_checkpoint_dir;

// The tokenizer of the tests: 10 bytes, token id i is kChars[i].
constexpr const char* kChars = "\n abcdefgh";

GptConfig tiny() { return testing::tiny_gpt_config(10); }

std::unique_ptr<Gpt> trained_looking_model(uint64_t seed) {
  return testing::spread_gpt(tiny(), seed);
}

// A checkpoint root under `dir` holding step 7 of `model`, with a run config whose
// data.tokenizer is DIR/tokenizer.json (written too) unless `with_config` is false.
fs::path write_checkpoint(const fs::path& dir, const Gpt& model, bool with_config = true) {
  const data::CharTokenizer tok = data::CharTokenizer::from_text(kChars);
  data::save_tokenizer(tok, (dir / "tokenizer.json").string());
  train::CheckpointContents c;
  c.model = model.state_dict();
  c.optimizer = {{"step", from_vector<int64_t>({7})}};
  c.state = {{"step", 7}, {"model", model.config().to_json()}};
  if (with_config) {
    c.state["config"] = {
        {"train_batch_size", 1},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
        {"model", model.config().to_json()},
        {"data", {{"train", "data/train_*.bin"}, {"tokenizer", (dir / "tokenizer.json").string()}}},
        {"trainer", {{"steps", 10}}}};
  }
  const fs::path root = dir / "checkpoints";
  train::CheckpointDir(root.string(), 0).save(7, c);
  return root;
}

void require_same_weights(const Gpt& got, const Gpt& want) {
  const StateDict g = got.state_dict(), w = want.state_dict();
  REQUIRE(g.size() == w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    INFO(w[i].first);
    CHECK(g[i].first == w[i].first);
    CHECK(g[i].second.to_vector<double>() == w[i].second.to_vector<double>());
  }
}

struct Run {
  int rc;
  std::string out, err;
};

// Runs tools/generate (from the test's runfiles) with `args`.
Run run_generate(const std::string& args) {
  const fs::path dir = fresh_dir("run");
  const std::string cmd = "tools/generate " + args + " >'" + (dir / "out").string() + "' 2>'" +
                          (dir / "err").string() + "'";
  const int status = std::system(cmd.c_str());
  REQUIRE(WIFEXITED(status));
  return {WEXITSTATUS(status), read_bytes(dir / "out"), read_bytes(dir / "err")};
}

std::string decode(const std::vector<int32_t>& ids) {
  return data::CharTokenizer::from_text(kChars).decode(ids);
}

TEST_CASE("a checkpoint loads through `latest` or its step directory", "[generate]") {
  const fs::path dir = fresh_dir("load");
  const std::unique_ptr<Gpt> model = trained_looking_model(3);
  const fs::path root = write_checkpoint(dir, *model);
  for (const fs::path& path : {root, root / "step_00000007"}) {
    INFO(path.string());
    CHECK(resolve_checkpoint_dir(path.string()) == (root / "step_00000007").string());
    const LoadedModel m = load_from_checkpoint(path.string());
    CHECK(m.model->config().to_json() == tiny().to_json());
    CHECK_FALSE(m.model->is_training());
    CHECK(m.tokenizer == (dir / "tokenizer.json").string());
    CHECK_THAT(m.description, Contains("step 7"));
    require_same_weights(*m.model, *model);
    const std::unique_ptr<data::Tokenizer> tok = load_tokenizer_for(m, "");
    CHECK(tok->vocab_size() == 10);
    // Producing N tokens: the loaded model samples what the saved one does.
    const SamplingOptions opts{0.8, 0, 1.0, 11};
    const std::vector<int32_t> got = sample(*m.model, tok->encode("ab"), 40, opts);
    CHECK(got.size() == 40);
    CHECK(got == sample(*model, tok->encode("ab"), 40, opts));
  }
}

TEST_CASE("checkpoint loading errors name what is missing", "[generate]") {
  const fs::path dir = fresh_dir("errors");
  CHECK_THAT(error_of([&] { resolve_checkpoint_dir((dir / "nope").string()); }),
             Contains("expected a checkpoint directory, found nothing"));
  CHECK_THAT(error_of([&] { resolve_checkpoint_dir(dir.string()); }), Contains("found neither"));
  // No run config in state.json: the tokenizer must be given.
  const std::unique_ptr<Gpt> model = trained_looking_model(3);
  const fs::path root = write_checkpoint(dir, *model, /*with_config=*/false);
  const LoadedModel m = load_from_checkpoint(root.string());
  CHECK(m.tokenizer.empty());
  CHECK_THAT(error_of([&] { load_tokenizer_for(m, ""); }),
             Contains("holds no run config naming a tokenizer; expected --tokenizer FILE"));
  CHECK(load_tokenizer_for(m, (dir / "tokenizer.json").string())->vocab_size() == 10);
  // A run config that does not parse (say, from an older schema) only loses the default.
  train::CheckpointContents c;
  c.model = model->state_dict();
  c.optimizer = {{"step", from_vector<int64_t>({8})}};
  c.state = {{"step", 8}, {"model", tiny().to_json()}, {"config", {{"bogus", 1}}}};
  train::CheckpointDir((dir / "old").string(), 0).save(8, c);
  const LoadedModel old = load_from_checkpoint((dir / "old").string());
  require_same_weights(*old.model, *model);
  CHECK_THAT(error_of([&] { load_tokenizer_for(old, ""); }),
             Contains("has a run config that does not parse ("));
  // A tokenizer larger than the model's vocabulary.
  data::save_tokenizer(data::CharTokenizer::from_text("\n abcdefghijk"),
                       (dir / "big.json").string());
  CHECK_THAT(error_of([&] { load_tokenizer_for(m, (dir / "big.json").string()); }),
             Contains("the tokenizer has 13 tokens; expected at most the model's vocab_size, 10"));
}

TEST_CASE("Hugging Face safetensors load with n_head from the metadata or a preset", "[generate]") {
  const fs::path dir = fresh_dir("hf");
  const std::unique_ptr<Gpt> model = trained_looking_model(5);
  const std::string with_meta = (dir / "with_meta.safetensors").string();
  save_hf_safetensors(with_meta, model->state_dict(), tiny());
  const LoadedModel m = load_from_hf(with_meta);
  CHECK(m.model->config().to_json() == tiny().to_json());
  CHECK_FALSE(m.model->is_training());
  require_same_weights(*m.model, *model);
  CHECK_THAT(error_of([&] { load_from_hf(with_meta, "gpt2"); }),
             Contains("holds 2 layers of width 16; --model gpt2 has 12 of width 768"));

  // Without the config in the metadata, no shape gives n_head and no preset is this small.
  const std::string bare = (dir / "bare.safetensors").string();
  write_safetensors(bare, tessera_to_hf(model->state_dict(), tiny()));
  CHECK_THAT(error_of([&] { load_from_hf(bare); }),
             Contains("match no GPT-2 preset; expected --model"));
  const std::string plain = (dir / "plain.safetensors").string();
  write_safetensors(plain, tessera_to_hf(model->state_dict(), tiny()), {{"n_head", "2"}});
  require_same_weights(*load_from_hf(plain).model, *model);
}

TEST_CASE("tools/generate streams the sampled tokens after the prompt", "[generate]") {
  const fs::path dir = fresh_dir("binary");
  const std::unique_ptr<Gpt> model = trained_looking_model(9);
  const fs::path root = write_checkpoint(dir, *model);
  const data::CharTokenizer tok = data::CharTokenizer::from_text(kChars);

  // Defaults: prompt "\n", temperature 1, seed 1337; 40 tokens run past block_size 16.
  Run r = run_generate("--checkpoint '" + root.string() + "' --tokens 40 --threads 1");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.out ==
        "\n" + decode(sample(*model, tok.encode("\n"), 40, SamplingOptions{1.0, 0, 1.0, 1337})));
  CHECK_THAT(r.err, Contains("40 tokens in"));

  r = run_generate("--checkpoint '" + (root / "step_00000007").string() +
                   "' --prompt 'bad cafe' --tokens 12 --temperature 0.7 --top-k 3 --top-p 0.9 "
                   "--seed 5");
  REQUIRE(r.rc == 0);
  CHECK(r.out == "bad cafe" + decode(sample(*model, tok.encode("bad cafe"), 12, {0.7, 3, 0.9, 5})));

  // Hugging Face weights with an explicit tokenizer; greedy.
  const std::string weights = (dir / "model.safetensors").string();
  save_hf_safetensors(weights, model->state_dict(), tiny());
  r = run_generate("--weights '" + weights + "' --tokenizer '" + (dir / "tokenizer.json").string() +
                   "' --prompt h --tokens 20 --temperature 0");
  REQUIRE(r.rc == 0);
  CHECK(r.out == "h" + decode(sample(*model, tok.encode("h"), 20, {0.0, 0, 1.0, 0})));
}

TEST_CASE("tools/generate decodes Hugging Face weights with the GPT-2 BPE by default",
          "[generate]") {
  const std::string bpe_dir = data::Gpt2Bpe::default_dir();
  if (!data::Gpt2Bpe::files_present(bpe_dir)) {
    WARN("GPT-2 BPE files not found in \"" << bpe_dir << "\" (run tools/setup.sh); skipping");
    return;
  }
  const data::Gpt2Bpe bpe = data::Gpt2Bpe::from_dir(bpe_dir);
  // A one-layer model with GPT-2's vocabulary.
  GptConfig cfg = tiny();
  cfg.vocab_size = 50257;
  cfg.n_layer = 1;
  cfg.n_embd = 8;
  Gpt model(cfg, 2);
  model.eval();
  const fs::path dir = fresh_dir("bpe");
  const std::string weights = (dir / "gpt2_tiny.safetensors").string();
  save_hf_safetensors(weights, model.state_dict(), cfg);
  const Run r = run_generate("--weights '" + weights + "' --prompt 'Hello, world' --tokens 12");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.err, Contains("gpt2 tokenizer, 50257 tokens"));
  CHECK(r.out == "Hello, world" + bpe.decode(sample(model, bpe.encode("Hello, world"), 12,
                                                    {1.0, 0, 1.0, 1337})));
}

TEST_CASE("tools/generate: bad flags exit 2, other errors exit 1 with one line", "[generate]") {
  const fs::path dir = fresh_dir("binary_errors");
  for (const std::string args :
       {"", "--checkpoint a --weights b", "--checkpoint a --tokens ten", "--checkpoint a --top-p 0",
        "--checkpoint a --temperature -1", "--checkpoint a --model gpt2", "--bogus 1"}) {
    INFO(args);
    const Run r = run_generate(args);
    CHECK(r.rc == 2);
    CHECK_THAT(r.err, Contains("usage: generate"));
  }
  const std::unique_ptr<Gpt> model = trained_looking_model(9);
  const fs::path root = write_checkpoint(dir, *model);
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--checkpoint '" + (dir / "missing").string() + "'", "found nothing"},
           {"--checkpoint '" + root.string() + "' --prompt xyz", "not in the vocabulary"},
           {"--weights '" + (dir / "missing.safetensors").string() + "'", "missing.safetensors"}}) {
    INFO(args);
    const Run r = run_generate(args);
    CHECK(r.rc == 1);
    CHECK(r.out.empty());
    CHECK(r.err.rfind("generate: error: ", 0) == 0);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK_THAT(r.err, Contains(message));
  }
}

}  // namespace
}  // namespace tessera::sampling
