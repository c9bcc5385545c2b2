// RunLock (Note [Run directory locks]): a second lock on a directory fails naming the
// holder's pid, also within one process; releasing it lets the next run in; a directory
// that cannot be created fails with its path.
#include "tools/trainer/run_lock.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "tests/test_files.h"

namespace tessera::train {
namespace {

TEST_CASE("a run directory takes one lock at a time", "[train]") {
  const std::string dir = (testing::fresh_dir("run_lock") / "run").string();
  auto first = std::make_unique<RunLock>(dir);
  const std::string pid = std::to_string(::getpid());
  CHECK_THROWS_WITH(RunLock(dir), "[train] " + dir + " is in use by process " + pid +
                                      " (it holds " + dir +
                                      "/.lock); expected one trainer per run directory");
  first.reset();
  CHECK_NOTHROW(RunLock(dir));
  CHECK_THROWS_WITH(RunLock("/proc/nope/run"),
                    Catch::StartsWith("[train] expected a run directory that can be created, "
                                      "found /proc/nope/run"));
}

}  // namespace
}  // namespace tessera::train
