// Command-line flags: values, switches, integers and integer lists, and the one-line usage
// errors the tools print.
#include "tools/cli/flags.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace tessera::cli {
namespace {

// Flags over `args` (argv[0] added) with --n, --list and --on known.
Flags parse(std::vector<std::string> args) {
  args.insert(args.begin(), "tool");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return Flags(static_cast<int>(argv.size()), argv.data(),
               {{"n", Flag::kValue}, {"list", Flag::kValue}, {"on", Flag::kSwitch}});
}

std::string usage_error(std::vector<std::string> args, bool list) {
  try {
    const Flags f = parse(std::move(args));
    if (list) {
      f.get_int_list("list", "1");
    } else {
      f.get_int("n", 0);
    }
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("integer flags parse whole values only", "[cli]") {
  CHECK(parse({"--n", "-12"}).get_int("n", 0) == -12);
  CHECK(parse({"--n=7"}).get_int("n", 0) == 7);
  CHECK(parse({}).get_int("n", 5) == 5);
  CHECK(usage_error({"--n", "7x"}, false) == "--n expected an integer, found \"7x\"");
  CHECK(usage_error({"--n", ""}, false) == "--n expected an integer, found \"\"");
}

TEST_CASE("integer lists are comma-separated, the fallback parsed alike", "[cli]") {
  CHECK(parse({"--list", "1,2,4"}).get_int_list("list", "9") == std::vector<int64_t>{1, 2, 4});
  CHECK(parse({"--list=3"}).get_int_list("list", "9") == std::vector<int64_t>{3});
  CHECK(parse({}).get_int_list("list", "0,1,2,3") == std::vector<int64_t>{0, 1, 2, 3});
  for (const char* bad : {"1,,2", "1,2,", ",1", "1;2", "a", ""}) {
    INFO(bad);
    CHECK(usage_error({"--list", bad}, true) ==
          std::string("--list expected integers separated by commas, found \"") + bad + "\"");
  }
}

TEST_CASE("unknown flags and stray arguments are usage errors", "[cli]") {
  CHECK(parse({"--on"}).has("on"));
  CHECK_THROWS_AS(parse({"--nope", "1"}), UsageError);
  CHECK_THROWS_AS(parse({"stray"}), UsageError);
}

}  // namespace
}  // namespace tessera::cli
