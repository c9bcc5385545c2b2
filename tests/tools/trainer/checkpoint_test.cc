// Checkpoint directories: save/latest/load round trips, pruning, and the errors for files
// that changed, went missing or were cut short after the save (Note [Atomic checkpoints]).
#include "tools/trainer/checkpoint.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/factories.h"
#include "parallel/comm/thread_comm.h"
#include "parallel/zero/flat_layout.h"
#include "tests/test_files.h"
#include "tests/testing.h"
#include "tools/trainer/manifest.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;
using Catch::Contains;
using testing::error_of;
using testing::fresh_dir;
using testing::read_bytes;

// Small contents whose values depend on `step`.
CheckpointContents contents(int64_t step) {
  const float s = static_cast<float>(step);
  CheckpointContents c;
  c.model = {
      {"transformer.wte.weight", from_vector<float>({s, 1.5f, -2.f, 0.25f, 3.f, -0.f}, {3, 2})},
      {"transformer.ln_f.bias", from_vector<float>({0.5f, s})}};
  c.optimizer = {{"step", from_vector<int64_t>({step})},
                 {"exp_avg.transformer.wte.weight",
                  from_vector<double>({1e-8, 2e-8, 3e-8, 4e-8, 5e-8, s}, {3, 2})}};
  c.state = {{"step", step}, {"loader", {{"shard", 0}, {"position", 4096 + step}}}};
  return c;
}

void require_equal(const StateDict& got, const StateDict& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(want[i].first);
    CHECK(got[i].first == want[i].first);
    CHECK(got[i].second.dtype() == want[i].second.dtype());
    CHECK(got[i].second.shape() == want[i].second.shape());
    CHECK(got[i].second.to_vector<double>() == want[i].second.to_vector<double>());
  }
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST_CASE("save, latest and load round-trip the contents", "[checkpoint]") {
  const fs::path root = fresh_dir("round_trip") / "ckpt";
  const CheckpointDir ckpt(root.string(), 0);
  CHECK_FALSE(ckpt.latest().has_value());  // no directory yet

  const std::string dir = ckpt.save(7, contents(7));
  CHECK(dir == (root / "step_00000007").string());
  CHECK(read_bytes(root / "latest") == "step_00000007\n");
  REQUIRE(ckpt.latest() == dir);
  CHECK(entries(dir) == std::vector<std::string>{"manifest.json", "model.safetensors",
                                                 "optimizer.safetensors", "state.json"});

  const CheckpointContents c = load_checkpoint(*ckpt.latest());
  const CheckpointContents want = contents(7);
  require_equal(c.model, want.model);
  require_equal(c.optimizer, want.optimizer);
  CHECK(c.state == want.state);

  // The manifest lists every file with its size and hash.
  const nlohmann::json manifest =
      nlohmann::json::parse(read_bytes(fs::path(dir) / "manifest.json"));
  CHECK(manifest["format"] == "tessera-checkpoint");
  CHECK(manifest["step"] == 7);
  REQUIRE(manifest["files"].size() == 3);
  for (const nlohmann::json& f : manifest["files"]) {
    const fs::path p = fs::path(dir) / f["name"].get<std::string>();
    CHECK(f["bytes"] == static_cast<int64_t>(fs::file_size(p)));
    CHECK(f["fnv1a64"] == file_fnv1a64(p.string()));
  }

  // A later save moves `latest`; saving a step again replaces it.
  ckpt.save(9, contents(9));
  CHECK(read_bytes(root / "latest") == "step_00000009\n");
  require_equal(load_checkpoint(*ckpt.latest()).model, contents(9).model);
  CheckpointContents again = contents(9);
  again.state["step"] = 90;
  ckpt.save(9, again);
  CHECK(load_checkpoint(*ckpt.latest()).state["step"] == 90);
  CHECK(entries(root) == std::vector<std::string>{"latest", "step_00000007", "step_00000009"});
}

TEST_CASE("keep_last prunes the oldest checkpoints", "[checkpoint]") {
  const fs::path root = fresh_dir("prune");
  const CheckpointDir ckpt(root.string(), 2);
  for (int64_t step : {10, 20, 30, 40}) ckpt.save(step, contents(step));
  CHECK(entries(root) == std::vector<std::string>{"latest", "step_00000030", "step_00000040"});
  CHECK(ckpt.latest() == (root / "step_00000040").string());
  require_equal(load_checkpoint((root / "step_00000030").string()).model, contents(30).model);

  // keep_last 0 keeps everything.
  const fs::path all = fresh_dir("prune_none");
  const CheckpointDir keep_all(all.string(), 0);
  for (int64_t step : {1, 2, 3}) keep_all.save(step, contents(step));
  CHECK(entries(all) ==
        std::vector<std::string>{"latest", "step_00000001", "step_00000002", "step_00000003"});
}

TEST_CASE("a leftover temporary directory of a crashed save is removed by the next save",
          "[checkpoint]") {
  const fs::path root = fresh_dir("leftover");
  const CheckpointDir ckpt(root.string(), 0);
  ckpt.save(10, contents(10));
  // A save of step 20 that died before its rename.
  fs::create_directories(root / ".step_00000020.tmp");
  testing::write_bytes(root / ".step_00000020.tmp" / "model.safetensors", "half a file");
  CHECK(ckpt.latest() == (root / "step_00000010").string());  // not the leftover
  ckpt.save(30, contents(30));
  CHECK(entries(root) == std::vector<std::string>{"latest", "step_00000010", "step_00000030"});
}

TEST_CASE("a checkpoint whose files changed after the save is refused", "[checkpoint]") {
  const fs::path root = fresh_dir("damaged");
  const CheckpointDir ckpt(root.string(), 0);
  const fs::path dir = ckpt.save(5, contents(5));
  const fs::path model = dir / "model.safetensors";
  const std::string good = read_bytes(model);
  const std::string hash = file_fnv1a64(model.string());

  SECTION("a flipped byte") {
    std::string bad = good;
    bad[bad.size() - 3] ^= 0x10;  // inside the data section: still a valid safetensors file
    testing::write_bytes(model, bad);
    CHECK(error_of([&] { load_checkpoint(dir.string()); }) ==
          "[checkpoint] " + model.string() + ": checksum mismatch, expected fnv1a64 " + hash +
              ", found " + file_fnv1a64(model.string()) + " (the file changed after the save)");
  }
  SECTION("a truncated file") {
    testing::write_bytes(model, good.substr(0, good.size() - 8));
    CHECK(error_of([&] { load_checkpoint(dir.string()); }) ==
          "[checkpoint] " + model.string() + ": expected " + std::to_string(good.size()) +
              " bytes (manifest), found " + std::to_string(good.size() - 8));
  }
  SECTION("a missing file") {
    fs::remove(dir / "state.json");
    CHECK(error_of([&] { load_checkpoint(dir.string()); }) ==
          "[checkpoint] " + (dir / "state.json").string() +
              " is listed in the manifest but missing");
  }
  SECTION("a damaged optimizer file does not stop reading the model alone") {
    const fs::path opt = dir / "optimizer.safetensors";
    std::string bad = read_bytes(opt);
    bad.back() ^= 0x01;
    testing::write_bytes(opt, bad);
    CHECK_THAT(error_of([&] { load_checkpoint(dir.string()); }),
               Contains(opt.string() + ": checksum mismatch"));
    const CheckpointContents c = load_checkpoint(dir.string(), /*with_optimizer=*/false);
    require_equal(c.model, contents(5).model);
    CHECK(c.optimizer.empty());
  }
}

// Rewrites the manifest of checkpoint `dir` with `edit` applied to its JSON.
template <class F>
void edit_manifest(const fs::path& dir, F&& edit) {
  nlohmann::json manifest = nlohmann::json::parse(read_bytes(dir / "manifest.json"));
  edit(manifest);
  testing::write_bytes(dir / "manifest.json", manifest.dump(1));
}

TEST_CASE("a manifest lists only regular files inside its checkpoint, each once, and all",
          "[checkpoint]") {
  const fs::path root = fresh_dir("manifest_paths");
  const CheckpointDir ckpt((root / "ckpt").string(), 0);
  const fs::path dir = ckpt.save(3, contents(3));
  const std::string manifest = (dir / "manifest.json").string();
  // An outside copy of state.json with the same bytes, so that size and hash agree.
  const fs::path outside = root / "outside.json";
  fs::copy_file(dir / "state.json", outside);
  auto rename_state = [&](const std::string& name) {
    edit_manifest(dir, [&](nlohmann::json& m) {
      for (nlohmann::json& f : m["files"]) {
        if (f["name"] == "state.json") f["name"] = name;
      }
      m["files"].push_back({{"name", "state.json"},
                            {"bytes", fs::file_size(outside)},
                            {"fnv1a64", file_fnv1a64(outside.string())}});
    });
  };
  SECTION("a relative path out of the checkpoint") {
    rename_state("../../outside.json");
    CHECK(error_of([&] { load_checkpoint(dir.string()); }) ==
          "[checkpoint] " + manifest +
              ": lists \"../../outside.json\"; expected the name of a file inside the checkpoint "
              "directory (one path component of at most 255 bytes)");
  }
  SECTION("an absolute path") {
    rename_state(outside.string());
    CHECK_THAT(error_of([&] { load_checkpoint(dir.string()); }),
               Contains(": lists \"" + outside.string() + "\"; expected the name of a file"));
  }
  SECTION("a listed file that is a symbolic link out of the checkpoint") {
    fs::remove(dir / "state.json");
    fs::create_symlink(outside, dir / "state.json");
    CHECK(error_of([&] { load_checkpoint(dir.string()); }) ==
          "[checkpoint] " + (dir / "state.json").string() +
              ": expected a regular file, found a symbolic link");
  }
  SECTION("a file the manifest does not list") {
    testing::write_bytes(dir / "extra.bin", "stray");
    CHECK(error_of([&] { load_checkpoint(dir.string()); }) ==
          "[checkpoint] " + (dir / "extra.bin").string() +
              " is not listed in the manifest; expected the checkpoint to hold exactly the "
              "manifest's files");
  }
  SECTION("an entry listed twice") {
    edit_manifest(dir, [](nlohmann::json& m) { m["files"].push_back(m["files"][0]); });
    CHECK_THAT(error_of([&] { load_checkpoint(dir.string()); }),
               Contains("\" twice; expected each file once"));
  }
  SECTION("the untouched checkpoint loads") {
    require_equal(load_checkpoint(dir.string()).model, contents(3).model);
  }
}

TEST_CASE("ranks save one optimizer shard each; a damaged or missing shard is refused",
          "[checkpoint]") {
  const fs::path root = fresh_dir("sharded");
  const CheckpointDir ckpt(root.string(), 0);
  std::vector<std::string> dirs(3);
  parallel::run_thread_ranks(3, [&](parallel::Communicator& comm) {
    CheckpointContents c;
    const int r = comm.rank();
    if (r == 0) {
      c.model = contents(4).model;
      c.state = contents(4).state;
    }
    c.optimizer_shard = streamed(StateDict{{"step", from_vector<int64_t>({4})},
                                           {"exp_avg", from_vector<float>({float(r), 0.5f})}});
    dirs[static_cast<size_t>(r)] = ckpt.save(4, c, &comm);
  });
  CHECK(dirs[1] == dirs[0]);
  const fs::path dir = dirs[0];
  CHECK(entries(dir) == std::vector<std::string>{"manifest.json", "model.safetensors", "state.json",
                                                 optimizer_shard_name(0), optimizer_shard_name(1),
                                                 optimizer_shard_name(2)});
  const CheckpointContents c = load_checkpoint(dir.string());
  CHECK(c.optimizer.empty());
  REQUIRE(c.optimizer_shards.size() == 3);
  for (int r = 0; r < 3; ++r) {
    CHECK(c.optimizer_shards[r][1].second.to_vector<float>() == std::vector<float>{float(r), 0.5f});
  }
  require_equal(c.model, contents(4).model);

  const fs::path shard1 = dir / optimizer_shard_name(1);
  SECTION("a damaged shard") {
    std::string bad = read_bytes(shard1);
    bad.back() ^= 0x01;
    testing::write_bytes(shard1, bad);
    CHECK_THAT(error_of([&] { load_checkpoint(dir.string()); }),
               Contains(shard1.string() + ": checksum mismatch"));
  }
  SECTION("a missing shard") {
    fs::remove(shard1);
    CHECK(error_of([&] { load_checkpoint(dir.string()); }) ==
          "[checkpoint] " + shard1.string() + " is listed in the manifest but missing");
    // Weights alone do not need the shards.
    CHECK(load_checkpoint(dir.string(), /*with_optimizer=*/false).optimizer_shards.empty());
  }
}

TEST_CASE("pipeline stages save whole parts that load merged; a damaged part is refused",
          "[checkpoint]") {
  const fs::path root = fresh_dir("parts");
  const CheckpointDir ckpt(root.string(), 0);
  // 4 ranks, 2 stages: ranks 0 and 2 write stage 0's and 1's parts; the tied wte is in both.
  const CheckpointContents whole = contents(6);
  std::vector<std::string> dirs(4);
  parallel::run_thread_ranks(4, [&](parallel::Communicator& comm) {
    CheckpointContents c;
    const int r = comm.rank();
    c.parts = 2;
    c.part = r % 2 == 0 ? r / 2 : -1;
    if (c.part == 0) {
      c.model = {whole.model[0]};
      c.optimizer = whole.optimizer;
    } else if (c.part == 1) {
      c.model = whole.model;  // wte again, and ln_f
      c.optimizer = {whole.optimizer[0]};
    }
    if (r == 0) c.state = whole.state;
    dirs[static_cast<size_t>(r)] = ckpt.save(6, c, &comm);
  });
  const fs::path dir = dirs[0];
  CHECK(entries(dir) == std::vector<std::string>{"manifest.json", model_part_name(0),
                                                 model_part_name(1), optimizer_part_name(0),
                                                 optimizer_part_name(1), "state.json"});
  const CheckpointContents c = load_checkpoint(dir.string());
  require_equal(c.model, whole.model);
  require_equal(c.optimizer, whole.optimizer);
  CHECK(c.state == whole.state);
  CHECK(load_checkpoint(dir.string(), /*with_optimizer=*/false).optimizer.empty());

  const fs::path part1 = dir / model_part_name(1);
  SECTION("a damaged part") {
    std::string bad = read_bytes(part1);
    bad.back() ^= 0x01;
    testing::write_bytes(part1, bad);
    CHECK_THAT(error_of([&] { load_checkpoint(dir.string()); }),
               Contains(part1.string() + ": checksum mismatch"));
  }
  SECTION("a missing part") {
    fs::remove(dir / optimizer_part_name(1));
    CHECK(error_of([&] { load_checkpoint(dir.string()); }) ==
          "[checkpoint] " + (dir / optimizer_part_name(1)).string() +
              " is listed in the manifest but missing");
    // Weights alone do not need the optimizer parts.
    require_equal(load_checkpoint(dir.string(), /*with_optimizer=*/false).model, whole.model);
  }
}

TEST_CASE("weights kept as parameter shards (ZeRO-3) load whole; their shards are verified",
          "[checkpoint]") {
  // Two parameters, "a" (3) and "b" (2 x 2), laid out for 2 ranks with a block each:
  // "a" padded to 4, so rank r holds a[2r, 2r + 2) and b[2r, 2r + 2) (flattened).
  const parallel::FlatLayout layout =
      parallel::make_flat_layout({{"a", {3}, 0}, {"b", {2, 2}, 0}}, 2, 1);
  const fs::path root = fresh_dir("param_shards");
  const CheckpointDir ckpt(root.string(), 0);
  std::string dir;
  parallel::run_thread_ranks(2, [&](parallel::Communicator& comm) {
    const int r = comm.rank();
    CheckpointContents c;
    if (r == 0) c.state = {{"step", 2}, {"zero", {{"stage", 3}, {"layout", layout.to_json()}}}};
    const std::vector<float> mine =
        r == 0 ? std::vector<float>{1, 2, 10, 11} : std::vector<float>{3, 0, 12, 13};
    c.optimizer_shard = streamed(StateDict{{"step", from_vector<int64_t>({2})},
                                           {"exp_avg", from_vector<float>({0, 0, 0, 0})},
                                           {kParameterShard, from_vector(mine)}});
    const std::string d = ckpt.save(2, c, &comm);
    if (r == 0) dir = d;
  });
  CHECK_FALSE(fs::exists(fs::path(dir) / "model.safetensors"));
  for (bool with_optimizer : {false, true}) {
    INFO("with_optimizer " << with_optimizer);
    const CheckpointContents c = load_checkpoint(dir, with_optimizer);
    REQUIRE(c.model.size() == 2);
    CHECK(c.model[0].first == "a");
    CHECK(c.model[0].second.to_vector<float>() == std::vector<float>{1, 2, 3});
    CHECK(c.model[1].second.shape() == Shape{2, 2});
    CHECK(c.model[1].second.to_vector<float>() == std::vector<float>{10, 11, 12, 13});
    // The parameter shards are consumed; the optimizer shards remain.
    CHECK(c.optimizer_shards.size() == (with_optimizer ? 2u : 0u));
    for (const StateDict& shard : c.optimizer_shards) CHECK(shard.size() == 2);
  }
  // A resume's load (whole_weights false) leaves the parameter shards where they are.
  const CheckpointContents kept = load_checkpoint(dir, true, -1, /*whole_weights=*/false);
  CHECK(kept.model.empty());
  REQUIRE(kept.optimizer_shards.size() == 2);
  CHECK(kept.optimizer_shards[1][2].first == kParameterShard);
  CHECK(kept.optimizer_shards[1][2].second.to_vector<float>() == std::vector<float>{3, 0, 12, 13});
  // Without model.safetensors the shards hold the weights: they are verified even when the
  // optimizer state is not wanted.
  const fs::path shard0 = fs::path(dir) / optimizer_shard_name(0);
  std::string bad = read_bytes(shard0);
  bad.back() ^= 0x01;
  testing::write_bytes(shard0, bad);
  CHECK_THAT(error_of([&] { load_checkpoint(dir, /*with_optimizer=*/false); }),
             Contains(shard0.string() + ": checksum mismatch"));
}

TEST_CASE("an incomplete save and a dangling latest pointer are errors", "[checkpoint]") {
  const fs::path root = fresh_dir("incomplete");
  const CheckpointDir ckpt(root.string(), 0);
  const fs::path dir = ckpt.save(3, contents(3));

  fs::remove(dir / "manifest.json");
  CHECK(error_of([&] { load_checkpoint(dir.string()); }) ==
        "[checkpoint] " + dir.string() +
            " has no manifest.json: the save did not complete; expected a committed checkpoint");
  CHECK(error_of([&] { load_checkpoint((root / "step_00000004").string()); }) ==
        "[checkpoint] expected a checkpoint directory, found no directory " +
            (root / "step_00000004").string());

  testing::write_bytes(root / "latest", "step_00000099\n");
  CHECK(error_of([&] { ckpt.latest(); }) ==
        "[checkpoint] " + (root / "latest").string() +
            " names \"step_00000099\"; expected a checkpoint directory beside it");
  testing::write_bytes(root / "latest", "../step_00000003\n");
  CHECK_THAT(error_of([&] { ckpt.latest(); }),
             Contains("names \"../step_00000003\"; expected a checkpoint directory beside it"));
  testing::write_bytes(root / "latest", "");
  CHECK_THAT(error_of([&] { ckpt.latest(); }),
             Contains("names \"\"; expected a checkpoint directory beside it"));
}

TEST_CASE("file_fnv1a64 is FNV-1a 64 of the bytes", "[checkpoint]") {
  const fs::path dir = fresh_dir("fnv");
  testing::write_bytes(dir / "empty", "");
  testing::write_bytes(dir / "a", "a");
  testing::write_bytes(dir / "foobar", "foobar");
  // Reference values of the FNV-1a 64 test suite.
  CHECK(file_fnv1a64((dir / "empty").string()) == "cbf29ce484222325");
  CHECK(file_fnv1a64((dir / "a").string()) == "af63dc4c8601ec8c");
  CHECK(file_fnv1a64((dir / "foobar").string()) == "85944171f73967e8");
  CHECK_THAT(error_of([&] { file_fnv1a64((dir / "missing").string()); }),
             Contains("[checkpoint] cannot read " + (dir / "missing").string()));
}

}  // namespace
}  // namespace tessera::train
