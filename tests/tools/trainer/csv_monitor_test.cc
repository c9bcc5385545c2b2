// DeepSpeed's csv_monitor layout (Note [CSV monitor files] in tools/trainer/csv_monitor.h):
// values as Python's repr() writes them (the expected strings were printed by Python 3.11),
// one file per tag with its header and "\r\n" rows, and a resumed run keeping the rows up
// to its checkpoint while a fresh run starts over, other CSV files untouched.
#include "tools/trainer/csv_monitor.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tests/test_files.h"

namespace tessera::train {
namespace {

TEST_CASE("values are written as Python's repr() writes them", "[csv_monitor]") {
  // /usr/bin/python3 -c "print(repr(v))" for each v.
  const std::vector<std::pair<double, std::string>> cases = {
      {0.0, "0.0"},
      {-0.0, "-0.0"},
      {1.0, "1.0"},
      {0.5, "0.5"},
      {0.0001, "0.0001"},
      {1e-05, "1e-05"},
      {3.3e-05, "3.3e-05"},
      {65536.0, "65536.0"},
      {123456789012345.0, "123456789012345.0"},
      {1234567890123456.0, "1234567890123456.0"},
      {1e+16, "1e+16"},
      {1.5e+16, "1.5e+16"},
      {1e+22, "1e+22"},
      {3.14159, "3.14159"},
      {-2.75, "-2.75"},
      {0.1, "0.1"},
      {0.3333333333333333, "0.3333333333333333"},
      {9.313225746154785e-10, "9.313225746154785e-10"},
      {6.02e+23, "6.02e+23"},
      {2.3456788063049316, "2.3456788063049316"},  // a float32 loss, widened
      {0.00012345, "0.00012345"},
      {9999999999999998.0, "9999999999999998.0"},
      {100.0, "100.0"},
      {1000000000000000.0, "1000000000000000.0"},
      {1.23456e-05, "1.23456e-05"},
      {std::numeric_limits<double>::infinity(), "inf"},
      {-std::numeric_limits<double>::infinity(), "-inf"},
      {std::numeric_limits<double>::quiet_NaN(), "nan"},
  };
  for (const auto& [value, want] : cases) {
    INFO(want);
    CHECK(python_float_repr(value) == want);
  }
}

TEST_CASE("one file per tag, with DeepSpeed's header and rows", "[csv_monitor]") {
  const std::filesystem::path dir = testing::fresh_dir("csv_monitor_layout") / "job";
  CsvMonitor csv(dir.string(), "Train/Samples/", -1);
  csv.write("Train/Samples/train_loss", 2.5, 0);
  csv.write("Train/Samples/lr", 1e-05, 32);
  csv.write("Train/Samples/train_loss", 2.25, 32);
  csv.write("Train/Samples/my metric", 3.0, 32);
  CHECK(CsvMonitor::file_name("Train/Samples/lr") == "Train_Samples_lr.csv");
  CHECK(testing::read_bytes(dir / "Train_Samples_train_loss.csv") ==
        "step,train_loss\r\n0,2.5\r\n32,2.25\r\n");
  CHECK(testing::read_bytes(dir / "Train_Samples_lr.csv") == "step,lr\r\n32,1e-05\r\n");
  CHECK(testing::read_bytes(dir / "Train_Samples_my_metric.csv") == "step,my metric\r\n32,3.0\r\n");
}

TEST_CASE("a resumed run keeps rows up to its checkpoint, a fresh run starts over",
          "[csv_monitor]") {
  const std::filesystem::path dir = testing::fresh_dir("csv_monitor_resume");
  {
    CsvMonitor csv(dir.string(), "Train/Samples/", -1);
    for (int64_t step = 0; step <= 96; step += 32) {
      csv.write("Train/Samples/lr", 0.5, step);
      csv.write("Train/Samples/train_loss", 2.0, step);
    }
  }
  testing::write_bytes(dir / "metrics.csv", "kind,step,loss\ntrain,1,2.0\n");
  testing::write_bytes(dir / "Other_lr.csv", "step,lr\r\n96,1.0\r\n");  // another prefix's
  {
    // A checkpoint at 64 samples: the rows after it are written again; train_loss is
    // written at the count before its step, so its row at 64 is the next step's.
    CsvMonitor csv(dir.string(), "Train/Samples/", 64, {"Train/Samples/train_loss"});
    csv.write("Train/Samples/lr", 0.25, 96);
  }
  CHECK(testing::read_bytes(dir / "Train_Samples_lr.csv") ==
        "step,lr\r\n0,0.5\r\n32,0.5\r\n64,0.5\r\n96,0.25\r\n");
  CHECK(testing::read_bytes(dir / "Train_Samples_train_loss.csv") ==
        "step,train_loss\r\n0,2.0\r\n32,2.0\r\n");
  { const CsvMonitor fresh(dir.string(), "Train/Samples/", -1); }
  CHECK_FALSE(std::filesystem::exists(dir / "Train_Samples_lr.csv"));
  CHECK(testing::read_bytes(dir / "metrics.csv") == "kind,step,loss\ntrain,1,2.0\n");
  CHECK(testing::read_bytes(dir / "Other_lr.csv") == "step,lr\r\n96,1.0\r\n");
}

}  // namespace
}  // namespace tessera::train
