// TensorBoard event files (Note [TensorBoard event files] in
// tools/trainer/tensorboard_writer.h): CRC-32C's check value, the bytes of two events
// against a golden file of tensorboard's own test vectors, and a written file decoded by an
// independent reader (tests/tools/trainer/read_tfevents.py: Debian's protobuf library and
// its own CRC-32C).
#include "tools/trainer/tensorboard_writer.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <string>

#include "tests/test_files.h"
#include "tests/testing.h"
#include "tests/tools/trainer/tfevents_reader.h"

namespace tessera::train {
namespace {

TEST_CASE("CRC-32C gives its check value, and masking rotates and adds", "[tensorboard]") {
  CHECK(crc32c("123456789") == 0xE3069283u);
  CHECK(crc32c("") == 0u);
  const uint32_t crc = crc32c("abc");
  CHECK(masked_crc32c("abc") == ((crc >> 15) | (crc << 17)) + 0xA282EAD8u);
}

TEST_CASE("two events give the golden file's bytes", "[tensorboard]") {
  // testdata/two_events.tfevents: Event{wall_time 1700000000.0, file_version
  // "brain.Event:2"} and Event{wall_time 1700000001.5, step 64, summary{value{tag
  // "Train/Samples/lr", simple_value 0.5}}}, the records tensorboard's writer makes.
  const std::string golden =
      testing::read_bytes("tests/tools/trainer/testdata/two_events.tfevents");
  CHECK(tfrecord(file_version_event(1700000000.0)) +
            tfrecord(scalar_event("Train/Samples/lr", 0.5f, 64, 1700000001.5)) ==
        golden);
}

TEST_CASE("a written event file decodes with an independent reader", "[tensorboard]") {
  const std::filesystem::path dir = testing::fresh_dir("tensorboard_writer");
  std::string first_path;
  {
    TensorBoardWriter w((dir / "job").string(), 1700000000.25);
    first_path = w.path();
    w.add_scalar("Train/Samples/train_loss", 2.75f, 0, 1700000001.0);
    w.add_scalar("Train/Samples/lr", 6e-4f, 32, 1700000002.0);
    w.add_scalar("Train/Samples/loss_scale", 65536.0f, 1ll << 40, 1700000003.0);
    w.add_scalar("Train/Samples/grad_norm", std::nanf(""), 96, 1700000004.0);
    w.add_session_start(97, 1700000005.0);
    w.flush();
  }
  // The file's name, and a second writer in the same second takes the next number.
  const std::string stem = (dir / "job" / "events.out.tfevents.1700000000.").string();
  CHECK(first_path.rfind(stem, 0) == 0);
  CHECK(first_path.substr(first_path.size() - 2) == ".0");
  const TensorBoardWriter second((dir / "job").string(), 1700000000.75);
  CHECK(second.path() == first_path.substr(0, first_path.size() - 1) + "1");

  const std::vector<nlohmann::json> records = testing::read_tfevents(first_path);
  REQUIRE(records.size() == 6);
  CHECK(records[0]["file_version"] == "brain.Event:2");
  CHECK(records[0]["wall_time"] == 1700000000.25);
  CHECK(records[0]["step"] == 0);
  CHECK(records[1]["tag"] == "Train/Samples/train_loss");
  CHECK(records[1]["simple_value"] == 2.75);
  CHECK(records[1]["step"] == 0);
  CHECK(records[2]["tag"] == "Train/Samples/lr");
  CHECK(records[2]["simple_value"].get<double>() == static_cast<double>(6e-4f));
  CHECK(records[2]["wall_time"] == 1700000002.0);
  CHECK(records[3]["step"] == (1ll << 40));
  CHECK(records[3]["simple_value"] == 65536.0);
  CHECK(records[4]["tag"] == "Train/Samples/grad_norm");
  CHECK(records[4]["simple_value"] == "nan");
  CHECK(records[4]["step"] == 96);
  CHECK(records[5]["session_log"] == "START");
  CHECK(records[5]["step"] == 97);
}

TEST_CASE("a writer that cannot create its folder says where", "[tensorboard]") {
  const std::filesystem::path file = testing::temp_path("tensorboard_not_a_folder");
  testing::write_bytes(file, "x");
  CHECK_THAT(testing::error_of([&] { TensorBoardWriter w((file / "job").string()); }),
             Catch::Contains("[tensorboard] cannot create the folder") &&
                 Catch::Contains("tensorboard_not_a_folder/job"));
}

}  // namespace
}  // namespace tessera::train
