// Leveled logging: a thin layer over spdlog's default logger with fmt format strings.
//
//   log_info("step {} loss {:.4f}", step, loss);
//
// Output goes to stderr/stdout through spdlog's default logger, one line per call:
// "[2024-05-01 12:00:00.123] [rank 3] [info] step 10 loss 2.3456" once set_log_rank(3)
// was called. Arguments are formatted only when the level is enabled.
//
// Note [Logging is process-wide]
// The logger, its level and its line pattern belong to the process (spdlog's registry),
// the one piece of global state Tessera accepts: a log line has nowhere else to go. An MPI
// or NCCL rank is a process, so set_log_rank() tags every line correctly there; under the
// thread backend (several ranks in one process) the last call wins, so thread-backend
// code that needs the rank in a message puts it in the message itself.
#pragma once

#include <fmt/core.h>

#include <string>
#include <string_view>
#include <utility>

namespace tessera {

enum class LogLevel { debug, info, warn, error, off };

// Parses "debug", "info", "warn", "error" or "off"; throws naming the accepted values.
LogLevel parse_log_level(std::string_view name);
// Lines below `level` are dropped (the default is info).
void set_log_level(LogLevel level);
LogLevel log_level();
// True when a line at `level` would be written.
bool log_enabled(LogLevel level);
// Puts "[rank N]" into every line from now on; a negative rank removes the tag.
void set_log_rank(int rank);

namespace detail {
// Writes one formatted line at `level`.
void log_line(LogLevel level, std::string_view message);
}  // namespace detail

template <class... Args>
void log_debug(fmt::format_string<Args...> format, Args&&... args) {
  if (log_enabled(LogLevel::debug)) {
    detail::log_line(LogLevel::debug, fmt::format(format, std::forward<Args>(args)...));
  }
}

template <class... Args>
void log_info(fmt::format_string<Args...> format, Args&&... args) {
  if (log_enabled(LogLevel::info)) {
    detail::log_line(LogLevel::info, fmt::format(format, std::forward<Args>(args)...));
  }
}

template <class... Args>
void log_warn(fmt::format_string<Args...> format, Args&&... args) {
  if (log_enabled(LogLevel::warn)) {
    detail::log_line(LogLevel::warn, fmt::format(format, std::forward<Args>(args)...));
  }
}

template <class... Args>
void log_error(fmt::format_string<Args...> format, Args&&... args) {
  if (log_enabled(LogLevel::error)) {
    detail::log_line(LogLevel::error, fmt::format(format, std::forward<Args>(args)...));
  }
}

}  // namespace tessera
