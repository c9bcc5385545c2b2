// Fuzzes the token shard reader (tools/data/shard.h): header fields, file size and token
// ids against a vocabulary of 300. Seeds: tests/fuzz/corpus/shard/.
#include <fstream>

#include "tests/fuzz/fuzz_target.h"
#include "tools/data/shard.h"

namespace tessera::fuzz {

FuzzTarget make_fuzz_target(const std::filesystem::path& work_dir) {
  return {{std::string("\x48\xd2\x34\x01", 4), std::string("\x01\x00\x00\x00", 4),
           std::string("\xff\xff\xff\x7f", 4), std::string("\x00\x00\x00\x80", 4)},
          [path = (work_dir / "train_000000.bin").string()](const std::string& input) {
            std::ofstream(path, std::ios::binary | std::ios::trunc) << input;
            const data::TokenShard shard(path);
            shard.validate_vocab(300);
          }};
}

}  // namespace tessera::fuzz
