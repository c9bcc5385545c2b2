// llm.c GPT-2 checkpoints: the byte layout of performance.md section 6, round trips, bf16
// files, and one case per validation rule.
#include "models/gpt2/llmc_weights.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "core/factories.h"
#include "models/gpt2/gpt.h"
#include "models/gpt2/hf_weights.h"
#include "tests/test_files.h"
#include "tests/testing.h"

namespace tessera {
namespace {

using testing::error_of;

GptConfig tiny_config() {
  GptConfig cfg;
  cfg.vocab_size = 10;
  cfg.block_size = 5;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 4;
  return cfg;
}

// A Tessera state dict of random values (padding rows of wte zero, as llm.c writes them).
StateDict random_state(const GptConfig& cfg) {
  Generator gen(11);
  StateDict sd;
  for (const auto& [name, shape] : gpt_parameter_shapes(cfg))
    sd.emplace_back(name, randn(shape, gen));
  sd[0].second.narrow(0, cfg.vocab_size, cfg.padded_vocab_size() - cfg.vocab_size).fill_(0.0);
  return sd;
}

std::map<std::string, Tensor> by_name(const StateDict& sd) {
  return std::map<std::string, Tensor>(sd.begin(), sd.end());
}

std::vector<float> floats(const Tensor& t) { return t.detach().to_vector<float>(); }

// The llm.c file, laid out independently of the code under test: header, then the 16
// arrays, each stacking its per-layer tensors. `vp` rows of wte; `bf16` truncates to the
// upper 16 bits after rounding as BFloat16 does.
std::string llmc_bytes(const StateDict& sd, const GptConfig& cfg, int32_t vp, bool bf16) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240326;
  header[1] = bf16 ? 5 : 3;
  header[2] = static_cast<int32_t>(cfg.block_size);
  header[3] = static_cast<int32_t>(cfg.vocab_size);
  header[4] = static_cast<int32_t>(cfg.n_layer);
  header[5] = static_cast<int32_t>(cfg.n_head);
  header[6] = static_cast<int32_t>(cfg.n_embd);
  header[7] = vp;
  std::string out(reinterpret_cast<const char*>(header.data()), 1024);
  const auto m = by_name(sd);
  auto put = [&](const Tensor& t) {
    for (float f : floats(t)) {
      if (bf16) {
        const uint16_t b = BFloat16(f).bits;
        out.append(reinterpret_cast<const char*>(&b), 2);
      } else {
        out.append(reinterpret_cast<const char*>(&f), 4);
      }
    }
  };
  const Tensor wte = m.at("transformer.wte.weight");
  put(vp <= wte.size(0) ? wte.narrow(0, 0, vp) : wte);
  for (int64_t r = wte.size(0); r < vp; ++r) put(zeros({cfg.n_embd}));
  put(m.at("transformer.wpe.weight"));
  for (const char* suffix :
       {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
        "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
        "mlp.c_proj.weight", "mlp.c_proj.bias"}) {
    for (int64_t i = 0; i < cfg.n_layer; ++i) {
      put(m.at("transformer.h." + std::to_string(i) + "." + suffix));
    }
  }
  put(m.at("transformer.ln_f.weight"));
  put(m.at("transformer.ln_f.bias"));
  return out;
}

void set_header(std::string& bytes, int index, int32_t value) {
  std::memcpy(bytes.data() + 4 * index, &value, 4);
}

TEST_CASE("write_llmc_checkpoint writes llm.c's layout and reads back", "[llmc]") {
  const GptConfig cfg = tiny_config();
  const StateDict sd = random_state(cfg);
  const std::string path = testing::temp_path("tiny.bin").string();
  write_llmc_checkpoint(path, sd, cfg);
  const std::string bytes = testing::read_bytes(path);
  // 128*4 + 5*4 + 2*(12*4 + 4*4*4*2 ... ) parameters: count them from the config.
  int64_t n_params = 0;
  for (const auto& [n, s] : gpt_parameter_shapes(cfg)) n_params += numel_of(s);
  CHECK(n_params == cfg.num_parameters());
  CHECK(bytes.size() == static_cast<size_t>(1024 + 4 * n_params));
  CHECK(bytes == llmc_bytes(sd, cfg, 128, false));

  const LlmcCheckpoint ck = read_llmc_checkpoint(path);
  CHECK(ck.config.to_json() == cfg.to_json());
  REQUIRE(ck.state.size() == sd.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    INFO(sd[i].first);
    CHECK(ck.state[i].first == sd[i].first);
    CHECK(ck.state[i].second.dtype() == DType::f32);
    CHECK(ck.state[i].second.shape() == sd[i].second.shape());
    CHECK(floats(ck.state[i].second) == floats(sd[i].second));
  }
}

TEST_CASE("a Gpt model round-trips through an llm.c checkpoint", "[llmc]") {
  const GptConfig cfg = tiny_config();
  Gpt a(cfg, 3);
  const std::string path = testing::temp_path("gpt.bin").string();
  write_llmc_checkpoint(path, a.state_dict(), cfg);
  Gpt b(cfg, 4);
  b.load_state_dict(read_llmc_checkpoint(path).state);
  const StateDict sa = a.state_dict(), sb = b.state_dict();
  for (size_t i = 0; i < sa.size(); ++i) CHECK(floats(sb[i].second) == floats(sa[i].second));
}

TEST_CASE("bf16 checkpoints (version 5) are read as f32", "[llmc]") {
  const GptConfig cfg = tiny_config();
  const StateDict sd = random_state(cfg);
  const std::string path = testing::temp_path("tiny_bf16.bin").string();
  testing::write_bytes(path, llmc_bytes(sd, cfg, 128, true));
  const LlmcCheckpoint ck = read_llmc_checkpoint(path);
  REQUIRE(ck.state.size() == sd.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    INFO(sd[i].first);
    CHECK(ck.state[i].second.dtype() == DType::f32);
    std::vector<float> want;
    for (float f : floats(sd[i].second)) want.push_back(static_cast<float>(BFloat16(f)));
    CHECK(floats(ck.state[i].second) == want);
  }
}

TEST_CASE("a file padded differently is re-padded to the config's size", "[llmc]") {
  const GptConfig cfg = tiny_config();
  const StateDict sd = random_state(cfg);
  for (int32_t vp : {10, 64, 256}) {
    INFO("padded_vocab_size " << vp);
    const std::string path = testing::temp_path("repad.bin").string();
    testing::write_bytes(path, llmc_bytes(sd, cfg, vp, false));
    const LlmcCheckpoint ck = read_llmc_checkpoint(path);
    const Tensor wte = ck.state.at(0).second;
    REQUIRE(wte.shape() == Shape{128, 4});
    CHECK(floats(wte) == floats(sd[0].second));  // rows [0, 10) kept, the rest zero
    CHECK(floats(ck.state.at(1).second) == floats(sd[1].second));
  }
}

TEST_CASE("malformed llm.c checkpoints are rejected", "[llmc]") {
  const GptConfig cfg = tiny_config();
  const std::string good = llmc_bytes(random_state(cfg), cfg, 128, false);
  const std::string path = testing::temp_path("bad.bin").string();
  auto err = [&](const std::string& bytes) {
    testing::write_bytes(path, bytes);
    return error_of([&] { read_llmc_checkpoint(path); });
  };
  const std::string where = "[llmc] " + path + ": ";
  std::string b = good;

  SECTION("missing file") {
    CHECK_THAT(error_of([] { read_llmc_checkpoint("/nonexistent/gpt2.bin"); }),
               Catch::StartsWith("[llmc] /nonexistent/gpt2.bin: cannot read the file size"));
  }
  SECTION("truncated header") {
    CHECK(err(good.substr(0, 100)) ==
          where + "file is truncated: expected at least the 1024-byte header, found 100 bytes");
  }
  SECTION("bad magic") {
    set_header(b, 0, 20240520);  // a token shard's magic
    CHECK(err(b) == where +
                        "header[0] magic: expected 20240326, found 20240520 (not an llm.c model "
                        "checkpoint)");
  }
  SECTION("bad version") {
    set_header(b, 1, 4);
    CHECK(err(b) == where + "header[1] version: expected 3 (fp32) or 5 (bf16), found 4");
  }
  SECTION("non-positive sizes") {
    set_header(b, 4, 0);
    CHECK(err(b) == where + "header[4] num_layers: expected > 0, found 0");
  }
  SECTION("channels not a multiple of heads") {
    set_header(b, 5, 3);
    CHECK(err(b) == where + "header[6] channels: expected a multiple of num_heads (3), found 4");
  }
  SECTION("padded vocabulary smaller than the vocabulary") {
    set_header(b, 7, 8);
    CHECK(err(b) == where + "header[7] padded_vocab_size: expected >= vocab_size (10), found 8");
  }
  SECTION("truncated data") {
    const std::string e = err(good.substr(0, good.size() - 4));
    CHECK(e == where + "file size: expected " + std::to_string(good.size()) +
                   " bytes (1024-byte header + " + std::to_string((good.size() - 1024) / 4) +
                   " parameters of 4 bytes), found " + std::to_string(good.size() - 4) +
                   " (truncated)");
  }
  SECTION("trailing bytes") {
    CHECK_THAT(err(good + "x"),
               Catch::EndsWith("found " + std::to_string(good.size() + 1) + " (trailing bytes)"));
  }
  SECTION("a bf16 header on an fp32 file") {
    set_header(b, 1, 5);
    CHECK_THAT(err(b), Catch::Contains("parameters of 2 bytes), found " +
                                       std::to_string(good.size()) + " (trailing bytes)"));
  }
  SECTION("absurd sizes") {
    set_header(b, 4, INT32_MAX);
    set_header(b, 6, 1 << 30);
    set_header(b, 5, 1);
    CHECK_THAT(err(b), Catch::Contains("impossibly large model"));
  }
}

TEST_CASE("write_llmc_checkpoint validates its input", "[llmc]") {
  GptConfig cfg = tiny_config();
  StateDict sd = random_state(cfg);
  const std::string path = testing::temp_path("w.bin").string();
  sd.pop_back();
  CHECK(error_of([&] { write_llmc_checkpoint(path, sd, cfg); }) ==
        "[llmc] " + path + ": 1 problem: missing \"transformer.ln_f.bias\" (4)");
  CHECK_FALSE(std::filesystem::exists(path));
  cfg.tie_word_embeddings = false;
  CHECK_THAT(error_of([&] { write_llmc_checkpoint(path, random_state(cfg), cfg); }),
             Catch::Contains("holds GPT-2 with biases and tied embeddings"));
}

}  // namespace
}  // namespace tessera
