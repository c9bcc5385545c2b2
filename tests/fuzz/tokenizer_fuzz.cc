// Fuzzes tokenizer.json (tools/data/tokenizer.h); an accepted tokenizer encodes and decodes
// a text too. GPT-2 descriptions find no tables in the fuzz directory and are rejected
// there. Seeds: tests/fuzz/corpus/tokenizer/.
#include <fstream>

#include "tests/fuzz/fuzz_target.h"
#include "tools/data/tokenizer.h"

namespace tessera::fuzz {

FuzzTarget make_fuzz_target(const std::filesystem::path& work_dir) {
  return {{"\"type\"", "\"char\"", "\"gpt2\"", "\"vocab\"", "\"chars\"", "\"eot_token\"",
           "\"vocab_size\""},
          [dir = work_dir](const std::string& input) {
            const std::string path = (dir / "tokenizer.json").string();
            std::ofstream(path, std::ios::binary | std::ios::trunc) << input;
            const std::unique_ptr<data::Tokenizer> tokenizer =
                data::load_tokenizer(path, (dir / "no_bpe_tables").string());
            const std::vector<int32_t> ids = tokenizer->encode("First Citizen:\nhello");
            tokenizer->decode(ids);
          }};
}

}  // namespace tessera::fuzz
