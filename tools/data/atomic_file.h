// Writing files so that readers see either the old file or the complete new one.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tessera::data {

// Writes the concatenation of `parts` to `path` atomically: into a temporary file in the
// same directory ("<path>.tmp.<pid>.<n>"), fsync'ed, renamed over `path`, and the directory
// fsync'ed. On any error the temporary file is removed and tessera::Error names the path
// and the failing call.
void write_file_atomically(const std::string& path, const std::vector<std::string_view>& parts);

}  // namespace tessera::data
