// Fuzzes the safetensors reader (models/io/safetensors.h). An input is the header's JSON,
// the separator "\n--data--\n", then the data section; the 8-byte header length is
// computed, so mutants reach the header's validation rather than stopping at the length.
// Seeds: tests/fuzz/corpus/safetensors/.
#include <fstream>

#include "models/io/safetensors.h"
#include "tests/fuzz/fuzz_target.h"

namespace tessera::fuzz {

FuzzTarget make_fuzz_target(const std::filesystem::path& work_dir) {
  return {{"\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"__metadata__\"", "\"F32\"", "\"F16\"",
           "\"BF16\"", "\"F64\"", "\"I32\"", "\"I64\"", "\"U8\"", "\"BOOL\"", "\"I8\"", "[0,0]",
           "\n--data--\n"},
          [path = (work_dir / "x.safetensors").string()](const std::string& input) {
            const std::string separator = "\n--data--\n";
            const size_t at = input.find(separator);
            const std::string header = input.substr(0, at);
            const std::string data =
                at == std::string::npos ? std::string() : input.substr(at + separator.size());
            std::string length(8, '\0');
            for (int i = 0; i < 8; ++i) length[i] = static_cast<char>(header.size() >> (8 * i));
            std::ofstream(path, std::ios::binary | std::ios::trunc) << length << header << data;
            read_safetensors(path);
          }};
}

}  // namespace tessera::fuzz
