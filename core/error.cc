#include "core/error.h"

namespace tessera::detail {

void throw_error(const std::string& message) { throw Error(message); }

void throw_internal(const char* file, int line, const char* cond, const std::string& message) {
  throw Error(str_cat("internal error (a bug in Tessera, please report it): ", cond, " failed at ",
                      file, ":", line, message.empty() ? "" : ": ", message));
}

}  // namespace tessera::detail
