#include "tools/data/tokenizer.h"

#include "core/error.h"
#include "core/file_io.h"
#include "core/json.h"
#include "tools/data/char_tokenizer.h"
#include "tools/data/gpt2_bpe.h"

namespace tessera::data {

void save_tokenizer(const Tokenizer& tokenizer, const std::string& path) {
  const std::string text = tokenizer.to_json().dump() + "\n";
  write_file_atomically(path, {text});
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, const std::string& bpe_dir) {
  const nlohmann::json doc = parse_json_file(path);
  const std::string root = str_cat(path, ": $");
  TS_CHECK(doc.is_object(), "[tokenizer] ", root, ": expected object, found ", describe_json(doc));
  const auto type = doc.find("type");
  TS_CHECK(type != doc.end(), "[tokenizer] ", root, ".type: required key missing");
  TS_CHECK(type->is_string() && (*type == "char" || *type == "gpt2"), "[tokenizer] ", root,
           ".type: expected one of \"char\", \"gpt2\", found ", describe_json(*type));
  if (*type == "char") return std::make_unique<CharTokenizer>(CharTokenizer::from_json(doc, path));

  JsonObjectReader r(doc, "tokenizer", root);
  r.required_one_of("type", {"gpt2"});
  const int64_t vocab_size = r.required<int64_t>("vocab_size");
  const int64_t eot = r.required<int64_t>("eot_token");
  r.finish();
  const std::string dir = bpe_dir.empty() ? Gpt2Bpe::default_dir() : bpe_dir;
  auto bpe = std::make_unique<Gpt2Bpe>(Gpt2Bpe::from_dir(dir));
  TS_CHECK(bpe->vocab_size() == vocab_size, "[tokenizer] ", r.key_path("vocab_size"),
           ": expected the vocabulary size of the BPE files in \"", dir, "\", ", bpe->vocab_size(),
           ", found ", vocab_size);
  TS_CHECK(*bpe->eot_token() == eot, "[tokenizer] ", r.key_path("eot_token"),
           ": expected the end-of-text id of the BPE files in \"", dir, "\", ", *bpe->eot_token(),
           ", found ", eot);
  return bpe;
}

}  // namespace tessera::data
