// Errors: TS_CHECK for user-facing failures, TS_INTERNAL_ASSERT for bugs.
//
// Every message is one line that says what was expected and what was found, led by the
// op or component in brackets: "[matmul] inner dimensions differ: (4, 5) vs (6, 2)".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tessera {

// The one exception type the library throws. Binaries turn it into a message and a
// non-zero exit code; library code never calls exit().
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A CUDA device was asked for and none is usable (absent, no driver, a driver too old, or a
// binary built without CUDA). Binaries exit with their own code for it (tools/cli/flags.h's
// kExitNoDevice), so a script can tell "no GPU here" from a failure.
class NoDeviceError : public Error {
 public:
  using Error::Error;
};

// Concatenates any streamable values into one string.
template <class... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

namespace detail {
[[noreturn]] void throw_error(const std::string& message);
[[noreturn]] void throw_internal(const char* file, int line, const char* cond,
                                 const std::string& message);
}  // namespace detail

}  // namespace tessera

// Throws tessera::Error with the concatenated message when `cond` is false.
#define TS_CHECK(cond, ...)                                            \
  do {                                                                 \
    if (!(cond)) [[unlikely]] {                                        \
      ::tessera::detail::throw_error(::tessera::str_cat(__VA_ARGS__)); \
    }                                                                  \
  } while (0)

// Unconditionally throws tessera::Error.
#define TS_FAIL(...) ::tessera::detail::throw_error(::tessera::str_cat(__VA_ARGS__))

// An invariant of Tessera itself; failing it is a bug in Tessera, and the message says so.
#define TS_INTERNAL_ASSERT(cond, ...)                                                       \
  do {                                                                                      \
    if (!(cond)) [[unlikely]] {                                                             \
      ::tessera::detail::throw_internal(__FILE__, __LINE__, #cond,                          \
                                        ::tessera::str_cat("" __VA_OPT__(, ) __VA_ARGS__)); \
    }                                                                                       \
  } while (0)
