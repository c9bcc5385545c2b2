#include "tools/data/gpt2_bpe.h"

#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/json.h"
#include "tools/data/pretokenize.h"

namespace tessera::data {
namespace {

constexpr const char* kEndOfText = "<|endoftext|>";
// Chunks longer than this are not cached (they are rare and would bloat the cache), and
// the cache is emptied when it reaches kMaxCacheEntries.
constexpr size_t kMaxCachedChunk = 64;
constexpr size_t kMaxCacheEntries = 1 << 20;

// "U+00E9".
std::string code_point_name(char32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "U+%04X", static_cast<unsigned>(cp));
  return buf;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TS_CHECK(in.good(), "[gpt2_bpe] cannot open \"", path, "\": ", std::strerror(errno),
           " (tools/setup.sh fetches encoder.json and vocab.bpe into "
           "$HOME/.cache/tessera/gpt2_bpe; TESSERA_GPT2_BPE_DIR points elsewhere)");
  std::ostringstream text;
  text << in.rdbuf();
  TS_CHECK(!in.bad(), "[gpt2_bpe] cannot read \"", path, "\": ", std::strerror(errno));
  return text.str();
}

// The raw bytes of a token string made of byte characters (gpt2_byte_encoder()), or
// throws naming the offending character.
std::string key_to_bytes(const std::string& key, const std::string& path) {
  static const std::array<int, 512> decoder = [] {
    std::array<int, 512> d;
    d.fill(-1);
    for (int b = 0; b < 256; ++b) d[gpt2_byte_encoder()[b]] = b;
    return d;
  }();
  std::string bytes;
  for (size_t i = 0; i < key.size();) {
    const auto b0 = static_cast<uint8_t>(key[i]);
    char32_t cp = b0;
    size_t len = 1;
    if (b0 >= 0x80) {
      // JSON strings are valid UTF-8; byte characters are below U+0200, so two bytes at most.
      len = (b0 & 0xE0) == 0xC0 ? 2 : (b0 & 0xF0) == 0xE0 ? 3 : 4;
      cp = b0 & (0x7F >> len);
      for (size_t k = 1; k < len && i + k < key.size(); ++k) {
        cp = (cp << 6) | (static_cast<uint8_t>(key[i + k]) & 0x3F);
      }
    }
    TS_CHECK(cp < decoder.size() && decoder[cp] >= 0, "[gpt2_bpe] \"", path, "\": token ",
             nlohmann::json(key).dump(), " expected only byte characters, found ",
             code_point_name(cp));
    bytes.push_back(static_cast<char>(decoder[cp]));
    i += len;
  }
  return bytes;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct Merge {
  int32_t rank;
  int32_t merged;
};

}  // namespace

const std::array<char32_t, 256>& gpt2_byte_encoder() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    std::array<bool, 256> printable{};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) t[b] = printable[b] ? static_cast<char32_t>(b) : next++;
    return t;
  }();
  return table;
}

struct Gpt2Bpe::Impl {
  std::vector<std::string> tokens;  // id -> bytes
  std::array<int32_t, 256> byte_token{};
  std::unordered_map<uint64_t, Merge> merges;  // (left, right) -> rank and result
  int64_t num_merges = 0;
  int32_t eot = -1;

  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  void load_encoder(const std::string& path, std::unordered_map<std::string, int32_t>& id_of);
  void load_merges(const std::string& path, const std::unordered_map<std::string, int32_t>& id_of);
  void bpe(std::string_view chunk, std::vector<int32_t>& out) const;
};

void Gpt2Bpe::Impl::load_encoder(const std::string& path,
                                 std::unordered_map<std::string, int32_t>& id_of) {
  const nlohmann::json doc = parse_json(read_file(path), path);
  TS_CHECK(doc.is_object() && !doc.empty(), "[gpt2_bpe] \"", path,
           "\": expected a non-empty JSON object from token to id, found ", describe_json(doc));
  const int64_t n = static_cast<int64_t>(doc.size());
  tokens.assign(n, std::string());
  std::vector<std::string> key_of(n);  // for duplicate messages
  for (const auto& [key, value] : doc.items()) {
    TS_CHECK(value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() < n,
             "[gpt2_bpe] \"", path, "\": token ", nlohmann::json(key).dump(),
             " expected an integer id in [0, ", n, "), found ", describe_json(value));
    const auto id = value.get<int32_t>();
    TS_CHECK(!key.empty(), "[gpt2_bpe] \"", path, "\": expected non-empty tokens, found \"\" (id ",
             id, ")");
    TS_CHECK(key_of[id].empty(), "[gpt2_bpe] \"", path, "\": expected unique ids, found id ", id,
             " for both ", nlohmann::json(key_of[id]).dump(), " and ", nlohmann::json(key).dump());
    key_of[id] = key;
    id_of.emplace(key, id);
    tokens[id] = key_to_bytes(key, path);
  }
  for (int b = 0; b < 256; ++b) {
    std::string key;
    const char32_t cp = gpt2_byte_encoder()[b];
    if (cp < 0x80) {
      key.push_back(static_cast<char>(cp));
    } else {
      key.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      key.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    const auto it = id_of.find(key);
    TS_CHECK(it != id_of.end(), "[gpt2_bpe] \"", path, "\": expected a token for byte ", b, " (",
             nlohmann::json(key).dump(), "), found none");
    byte_token[b] = it->second;
  }
  const auto eot_it = id_of.find(kEndOfText);
  TS_CHECK(eot_it != id_of.end(), "[gpt2_bpe] \"", path, "\": expected the token \"", kEndOfText,
           "\", found none");
  eot = eot_it->second;
}

void Gpt2Bpe::Impl::load_merges(const std::string& path,
                                const std::unordered_map<std::string, int32_t>& id_of) {
  const std::string text = read_file(path);
  std::unordered_map<uint64_t, int64_t> line_of;  // for duplicate messages
  size_t pos = 0;
  for (int64_t line = 1; pos < text.size(); ++line) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    const std::string_view entry(text.data() + pos, eol - pos);
    pos = eol + 1;
    if (line == 1 && entry.starts_with("#version")) continue;
    const std::string where = str_cat("[gpt2_bpe] \"", path, "\" line ", line, ": ");
    const size_t space = entry.find(' ');
    TS_CHECK(space != std::string_view::npos && space > 0 && space + 1 < entry.size() &&
                 entry.find(' ', space + 1) == std::string_view::npos,
             where, "expected \"left right\", found ", nlohmann::json(std::string(entry)).dump());
    const std::string left(entry.substr(0, space));
    const std::string right(entry.substr(space + 1));
    const auto l = id_of.find(left);
    const auto r = id_of.find(right);
    const auto m = id_of.find(left + right);
    TS_CHECK(l != id_of.end(), where, "expected a token of encoder.json, found ",
             nlohmann::json(left).dump());
    TS_CHECK(r != id_of.end(), where, "expected a token of encoder.json, found ",
             nlohmann::json(right).dump());
    TS_CHECK(m != id_of.end(), where, "expected the merged token ",
             nlohmann::json(left + right).dump(), " in encoder.json, found none");
    const uint64_t key = pair_key(l->second, r->second);
    const auto [it, fresh] = line_of.emplace(key, line);
    TS_CHECK(fresh, where, "expected each pair once, found ",
             nlohmann::json(std::string(entry)).dump(), " again (first at line ", it->second, ")");
    TS_CHECK(num_merges < std::numeric_limits<int32_t>::max(), where, "too many merges");
    merges.emplace(key, Merge{static_cast<int32_t>(num_merges++), m->second});
  }
}

void Gpt2Bpe::Impl::bpe(std::string_view chunk, std::vector<int32_t>& out) const {
  std::vector<int32_t> word(chunk.size());
  for (size_t i = 0; i < chunk.size(); ++i) word[i] = byte_token[static_cast<uint8_t>(chunk[i])];
  while (word.size() > 1) {
    // The pair with the lowest rank...
    Merge best{std::numeric_limits<int32_t>::max(), -1};
    uint64_t best_key = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const uint64_t key = pair_key(word[i], word[i + 1]);
      const auto it = merges.find(key);
      if (it != merges.end() && it->second.rank < best.rank) {
        best = it->second;
        best_key = key;
      }
    }
    if (best.merged < 0) break;
    // ...is merged wherever it occurs, left to right and without overlap, as GPT-2 does.
    size_t w = 0;
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && pair_key(word[i], word[i + 1]) == best_key) {
        word[w++] = best.merged;
        i += 2;
      } else {
        word[w++] = word[i++];
      }
    }
    word.resize(w);
  }
  out.insert(out.end(), word.begin(), word.end());
}

Gpt2Bpe::Gpt2Bpe(const std::string& encoder_json, const std::string& vocab_bpe)
    : impl_(std::make_unique<Impl>()) {
  std::unordered_map<std::string, int32_t> id_of;  // token string (byte characters) -> id
  impl_->load_encoder(encoder_json, id_of);
  impl_->load_merges(vocab_bpe, id_of);
}

Gpt2Bpe Gpt2Bpe::from_dir(const std::string& dir) {
  return Gpt2Bpe((std::filesystem::path(dir) / "encoder.json").string(),
                 (std::filesystem::path(dir) / "vocab.bpe").string());
}

Gpt2Bpe::~Gpt2Bpe() = default;
Gpt2Bpe::Gpt2Bpe(Gpt2Bpe&&) noexcept = default;
Gpt2Bpe& Gpt2Bpe::operator=(Gpt2Bpe&&) noexcept = default;

std::string Gpt2Bpe::default_dir() {
  if (const char* env = std::getenv("TESSERA_GPT2_BPE_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  const std::string suffix = "/.cache/tessera/gpt2_bpe";
  std::string from_env;
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    from_env = home + suffix;
    if (files_present(from_env)) return from_env;
  }
  if (const passwd* pw = ::getpwuid(::getuid()); pw != nullptr && pw->pw_dir != nullptr) {
    const std::string from_passwd = pw->pw_dir + suffix;
    if (files_present(from_passwd) || from_env.empty()) return from_passwd;
  }
  return from_env;
}

bool Gpt2Bpe::files_present(const std::string& dir) {
  std::error_code ec;
  return std::filesystem::is_regular_file(std::filesystem::path(dir) / "encoder.json", ec) &&
         std::filesystem::is_regular_file(std::filesystem::path(dir) / "vocab.bpe", ec);
}

const std::string& Gpt2Bpe::token_bytes(int32_t id) const {
  TS_CHECK(id >= 0 && id < vocab_size(), "[gpt2_bpe] token id expected in [0, ", vocab_size(),
           "), found ", id);
  return impl_->tokens[id];
}

int64_t Gpt2Bpe::num_merges() const { return impl_->num_merges; }
int64_t Gpt2Bpe::vocab_size() const { return static_cast<int64_t>(impl_->tokens.size()); }
std::optional<int32_t> Gpt2Bpe::eot_token() const { return impl_->eot; }

std::vector<int32_t> Gpt2Bpe::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  for_each_pretoken(text, [&](std::string_view chunk) {
    if (chunk.size() == 1) {
      ids.push_back(impl_->byte_token[static_cast<uint8_t>(chunk[0])]);
      return;
    }
    const bool cacheable = chunk.size() <= kMaxCachedChunk;
    if (cacheable) {
      std::lock_guard<std::mutex> lock(impl_->cache_mutex);
      const auto it = impl_->cache.find(std::string(chunk));
      if (it != impl_->cache.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const size_t start = ids.size();
    impl_->bpe(chunk, ids);
    if (cacheable) {
      std::lock_guard<std::mutex> lock(impl_->cache_mutex);
      if (impl_->cache.size() >= kMaxCacheEntries) impl_->cache.clear();
      impl_->cache.emplace(std::string(chunk),
                           std::vector<int32_t>(ids.begin() + start, ids.end()));
    }
  });
  return ids;
}

std::string Gpt2Bpe::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    TS_CHECK(ids[i] >= 0 && ids[i] < vocab_size(), "[gpt2_bpe] token id at position ", i,
             " expected in [0, ", vocab_size(), "), found ", ids[i]);
    out += impl_->tokens[ids[i]];
  }
  return out;
}

nlohmann::json Gpt2Bpe::to_json() const {
  return {{"type", "gpt2"}, {"vocab_size", vocab_size()}, {"eot_token", impl_->eot}};
}

}  // namespace tessera::data
