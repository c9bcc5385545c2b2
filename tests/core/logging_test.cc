#include "core/logging.h"

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <catch2/catch.hpp>
#include <memory>
#include <sstream>

#include "core/error.h"

using Catch::Matchers::Contains;

namespace {

// Routes the default logger into a string for the lifetime of the capture.
class Capture {
 public:
  Capture() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  }
  ~Capture() { spdlog::set_default_logger(previous_); }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

}  // namespace

TEST_CASE("log lines carry the rank, the level and the formatted message", "[logging]") {
  Capture capture;
  tessera::set_log_level(tessera::LogLevel::info);
  tessera::set_log_rank(3);
  tessera::log_info("step {} loss {:.2f}", 10, 2.3456);
  tessera::log_warn("careful: {}", "x");
  const std::string text = capture.text();
  CHECK_THAT(text, Contains("[rank 3]") && Contains("[info] step 10 loss 2.35"));
  CHECK_THAT(text, Contains("[warning] careful: x"));
  tessera::set_log_rank(-1);
  tessera::log_error("no rank");
  CHECK_THAT(capture.text(), Contains("[error] no rank"));
  CHECK(capture.text().find("[rank 3] [error]") == std::string::npos);
}

TEST_CASE("levels below the threshold are dropped", "[logging]") {
  Capture capture;
  tessera::set_log_level(tessera::LogLevel::warn);
  CHECK(tessera::log_level() == tessera::LogLevel::warn);
  CHECK_FALSE(tessera::log_enabled(tessera::LogLevel::info));
  tessera::log_info("hidden {}", 1);
  tessera::log_debug("hidden {}", 2);
  tessera::log_error("shown {}", 3);
  CHECK(capture.text().find("hidden") == std::string::npos);
  CHECK_THAT(capture.text(), Contains("shown 3"));
  tessera::set_log_level(tessera::LogLevel::debug);
  tessera::log_debug("now {}", "visible");
  CHECK_THAT(capture.text(), Contains("now visible"));
  tessera::set_log_level(tessera::LogLevel::info);
}

TEST_CASE("parse_log_level", "[logging]") {
  CHECK(tessera::parse_log_level("debug") == tessera::LogLevel::debug);
  CHECK(tessera::parse_log_level("off") == tessera::LogLevel::off);
  CHECK_THROWS_WITH(tessera::parse_log_level("verbose"), Contains("found \"verbose\""));
}
