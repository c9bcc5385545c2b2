#include "models/gpt2/llmc_weights.h"

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "core/error.h"
#include "core/factories.h"
#include "core/file_io.h"
#include "core/grad_mode.h"
#include "models/gpt2/hf_weights.h"
#include "models/io/safetensors.h"

namespace tessera {
namespace {

static_assert(std::endian::native == std::endian::little, "llm.c files are little-endian");

constexpr int32_t kMagic = 20240326;
constexpr int32_t kVersionF32 = 3;
constexpr int32_t kVersionBF16 = 5;
constexpr int64_t kHeaderInts = 256;
constexpr int64_t kHeaderBytes = kHeaderInts * 4;

// One of the 16 arrays: the Tessera name suffix (after "transformer." or
// "transformer.h.{i}."), whether it is stacked over layers, and its per-layer shape.
struct Array {
  const char* name;
  bool per_layer;
  Shape shape;
};

std::vector<Array> llmc_arrays(const GptConfig& cfg, int64_t vp) {
  const int64_t c = cfg.n_embd;
  return {
      {"wte.weight", false, {vp, c}},
      {"wpe.weight", false, {cfg.block_size, c}},
      {"ln_1.weight", true, {c}},
      {"ln_1.bias", true, {c}},
      {"attn.c_attn.weight", true, {3 * c, c}},
      {"attn.c_attn.bias", true, {3 * c}},
      {"attn.c_proj.weight", true, {c, c}},
      {"attn.c_proj.bias", true, {c}},
      {"ln_2.weight", true, {c}},
      {"ln_2.bias", true, {c}},
      {"mlp.c_fc.weight", true, {4 * c, c}},
      {"mlp.c_fc.bias", true, {4 * c}},
      {"mlp.c_proj.weight", true, {c, 4 * c}},
      {"mlp.c_proj.bias", true, {c}},
      {"ln_f.weight", false, {c}},
      {"ln_f.bias", false, {c}},
  };
}

std::string tessera_name(const Array& a, int64_t layer) {
  return a.per_layer ? str_cat("transformer.h.", layer, ".", a.name)
                     : str_cat("transformer.", a.name);
}

// Number of parameters in the file, or -1 on int64 overflow (absurd headers).
int64_t count_parameters(const std::vector<Array>& arrays, int64_t n_layer) {
  int64_t total = 0;
  for (const Array& a : arrays) {
    int64_t n = a.per_layer ? n_layer : 1;
    for (int64_t d : a.shape) {
      if (__builtin_mul_overflow(n, d, &n)) return -1;
    }
    if (__builtin_add_overflow(total, n, &total)) return -1;
  }
  return total;
}

// Reads `nbytes` or throws; the size check comes first, so a failure here is an I/O error.
void read_bytes(std::ifstream& in, void* dst, int64_t nbytes, const std::string& where,
                const std::string& what) {
  in.read(static_cast<char*>(dst), nbytes);
  TS_CHECK(in.gcount() == nbytes, where, "reading ", what, " failed after ", in.gcount(), " of ",
           nbytes, " bytes");
}

// Reads one tensor of `shape` stored as f32 or bf16 into a new f32 tensor.
Tensor read_tensor(std::ifstream& in, const Shape& shape, bool bf16, const std::string& where,
                   const std::string& what) {
  Tensor t = empty(shape);
  const int64_t n = t.numel();
  float* out = t.data_ptr<float>();
  if (!bf16) {
    read_bytes(in, out, n * 4, where, what);
    return t;
  }
  std::vector<uint16_t> raw(static_cast<size_t>(n));
  read_bytes(in, raw.data(), n * 2, where, what);
  for (int64_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(uint32_t{raw[i]} << 16);
  return t;
}

}  // namespace

LlmcCheckpoint read_llmc_checkpoint(const std::string& path) {
  const std::string where = str_cat("[llmc] ", path, ": ");
  std::error_code ec;
  const uintmax_t file_bytes = std::filesystem::file_size(path, ec);
  TS_CHECK(!ec, where, "cannot read the file size: ", ec.message());
  std::ifstream in(path, std::ios::binary);
  TS_CHECK(in, where, "cannot open: ", std::strerror(errno));
  TS_CHECK(file_bytes >= static_cast<uintmax_t>(kHeaderBytes), where,
           "file is truncated: expected at least the ", kHeaderBytes, "-byte header, found ",
           file_bytes, " bytes");

  std::array<int32_t, kHeaderInts> h{};
  read_bytes(in, h.data(), kHeaderBytes, where, "the header");
  TS_CHECK(h[0] == kMagic, where, "header[0] magic: expected ", kMagic, ", found ", h[0],
           " (not an llm.c model checkpoint)");
  TS_CHECK(h[1] == kVersionF32 || h[1] == kVersionBF16, where, "header[1] version: expected ",
           kVersionF32, " (fp32) or ", kVersionBF16, " (bf16), found ", h[1]);
  const char* fields[] = {"max_seq_len", "vocab_size", "num_layers",
                          "num_heads",   "channels",   "padded_vocab_size"};
  for (int i = 2; i < 8; ++i) {
    TS_CHECK(h[i] > 0, where, "header[", i, "] ", fields[i - 2], ": expected > 0, found ", h[i]);
  }
  TS_CHECK(h[6] % h[5] == 0, where, "header[6] channels: expected a multiple of num_heads (", h[5],
           "), found ", h[6]);
  TS_CHECK(h[7] >= h[3], where, "header[7] padded_vocab_size: expected >= vocab_size (", h[3],
           "), found ", h[7]);

  LlmcCheckpoint ckpt;
  GptConfig& cfg = ckpt.config;
  cfg.block_size = h[2];
  cfg.vocab_size = h[3];
  cfg.n_layer = h[4];
  cfg.n_head = h[5];
  cfg.n_embd = h[6];
  cfg.bias = true;
  cfg.tie_word_embeddings = true;
  const int64_t file_vp = h[7];
  const bool bf16 = h[1] == kVersionBF16;
  const int64_t elem = bf16 ? 2 : 4;

  const std::vector<Array> arrays = llmc_arrays(cfg, file_vp);
  const int64_t n_params = count_parameters(arrays, cfg.n_layer);
  TS_CHECK(n_params >= 0 && n_params < (int64_t{1} << 60), where,
           "header sizes describe an impossibly large model (", cfg.n_layer, " layers, ",
           cfg.n_embd, " channels)");
  const uintmax_t want_bytes = static_cast<uintmax_t>(kHeaderBytes + n_params * elem);
  TS_CHECK(file_bytes == want_bytes, where, "file size: expected ", want_bytes, " bytes (",
           kHeaderBytes, "-byte header + ", n_params, " parameters of ", elem, " bytes), found ",
           file_bytes, file_bytes < want_bytes ? " (truncated)" : " (trailing bytes)");

  std::map<std::string, Tensor> by_name;
  for (const Array& a : arrays) {
    for (int64_t i = 0; i < (a.per_layer ? cfg.n_layer : 1); ++i) {
      const std::string name = tessera_name(a, i);
      by_name[name] = read_tensor(in, a.shape, bf16, where, name);
    }
  }
  Tensor& wte = by_name.at("transformer.wte.weight");
  if (file_vp != cfg.padded_vocab_size()) {
    Tensor padded = zeros({cfg.padded_vocab_size(), cfg.n_embd});
    padded.narrow(0, 0, cfg.vocab_size).copy_(wte.narrow(0, 0, cfg.vocab_size));
    wte = padded;
  }
  for (const auto& [name, shape] : gpt_parameter_shapes(cfg)) {
    ckpt.state.emplace_back(name, by_name.at(name));
  }
  return ckpt;
}

void write_llmc_checkpoint(const std::string& path, const StateDict& state, const GptConfig& cfg) {
  const std::string where = str_cat("[llmc] ", path, ": ");
  TS_CHECK(cfg.bias && cfg.tie_word_embeddings, where,
           "the llm.c format holds GPT-2 with biases and tied embeddings; found bias = ", cfg.bias,
           ", tie_word_embeddings = ", cfg.tie_word_embeddings);
  check_gpt_state_dict(state, cfg, str_cat("[llmc] ", path));
  std::map<std::string, Tensor> by_name(state.begin(), state.end());

  std::array<int32_t, kHeaderInts> h{};
  h[0] = kMagic;
  h[1] = kVersionF32;
  const int64_t values[] = {cfg.block_size, cfg.vocab_size, cfg.n_layer,
                            cfg.n_head,     cfg.n_embd,     cfg.padded_vocab_size()};
  for (int i = 0; i < 6; ++i) {
    TS_CHECK(values[i] > 0 && values[i] <= INT32_MAX, where, "header[", i + 2,
             "]: expected a positive int32, found ", values[i]);
    h[i + 2] = static_cast<int32_t>(values[i]);
  }

  NoGradGuard no_grad;
  write_file_atomically(path, [&](const WriteBytes& write) {
    write(h.data(), kHeaderBytes);
    for (const Array& a : llmc_arrays(cfg, cfg.padded_vocab_size())) {
      for (int64_t i = 0; i < (a.per_layer ? cfg.n_layer : 1); ++i) {
        const Tensor t =
            by_name.at(tessera_name(a, i)).detach().to(Device::cpu()).to(DType::f32).contiguous();
        write(t.raw_data(), t.nbytes());
      }
    }
  });
}

}  // namespace tessera
