#include "core/logging.h"

#include <spdlog/spdlog.h>

#include "core/error.h"

namespace tessera {
namespace {

spdlog::level::level_enum to_spdlog(LogLevel level) {
  switch (level) {
    case LogLevel::debug:
      return spdlog::level::debug;
    case LogLevel::info:
      return spdlog::level::info;
    case LogLevel::warn:
      return spdlog::level::warn;
    case LogLevel::error:
      return spdlog::level::err;
    case LogLevel::off:
      return spdlog::level::off;
  }
  TS_INTERNAL_ASSERT(false, "unknown log level ", static_cast<int>(level));
}

}  // namespace

LogLevel parse_log_level(std::string_view name) {
  if (name == "debug") return LogLevel::debug;
  if (name == "info") return LogLevel::info;
  if (name == "warn") return LogLevel::warn;
  if (name == "error") return LogLevel::error;
  if (name == "off") return LogLevel::off;
  TS_FAIL("[logging] expected a log level \"debug\", \"info\", \"warn\", \"error\" or \"off\"; ",
          "found \"", name, "\"");
}

void set_log_level(LogLevel level) { spdlog::set_level(to_spdlog(level)); }

LogLevel log_level() {
  switch (spdlog::get_level()) {
    case spdlog::level::trace:
    case spdlog::level::debug:
      return LogLevel::debug;
    case spdlog::level::info:
      return LogLevel::info;
    case spdlog::level::warn:
      return LogLevel::warn;
    case spdlog::level::err:
    case spdlog::level::critical:
      return LogLevel::error;
    default:
      return LogLevel::off;
  }
}

bool log_enabled(LogLevel level) {
  return level != LogLevel::off && spdlog::default_logger_raw()->should_log(to_spdlog(level));
}

void set_log_rank(int rank) {
  if (rank < 0) {
    spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
  } else {
    spdlog::set_pattern(str_cat("[%Y-%m-%d %H:%M:%S.%e] [rank ", rank, "] [%^%l%$] %v"));
  }
}

void detail::log_line(LogLevel level, std::string_view message) {
  spdlog::default_logger_raw()->log(to_spdlog(level), "{}", message);
}

}  // namespace tessera
