#include "tools/trainer/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/factories.h"
#include "core/file_io.h"
#include "core/json.h"
#include "models/io/safetensors.h"
#include "parallel/zero/flat_layout.h"
#include "tools/trainer/manifest.h"

namespace tessera::train {
namespace fs = std::filesystem;
namespace {

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

// Steps of the committed checkpoints under `root`, ascending.
std::vector<int64_t> committed_steps(const fs::path& root) {
  std::vector<int64_t> steps;
  if (!fs::is_directory(root)) return steps;
  for (const fs::directory_entry& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    long long step = 0;
    char tail = 0;
    if (e.is_directory() && std::sscanf(name.c_str(), "step_%lld%c", &step, &tail) == 1 &&
        name == step_name(step) && fs::exists(e.path() / "manifest.json")) {
      steps.push_back(step);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// Where rank r's optimizer shard holds its parameter shard (kParameterShard); throws when
// it has none.
StateDict::iterator parameter_shard_of(StateDict& shard, size_t r) {
  const auto it = std::find_if(shard.begin(), shard.end(),
                               [](const auto& kv) { return kv.first == kParameterShard; });
  TS_CHECK(it != shard.end(), "[checkpoint] ", optimizer_shard_name(static_cast<int>(r)),
           ": expected the parameter shard \"", kParameterShard,
           "\" (the checkpoint has no model.safetensors), found none");
  return it;
}

// The whole weights from the ranks' parameter shards (kParameterShard), which are removed
// from `shards`, reassembled with the layout at $.zero.layout of `state`.
StateDict weights_from_shards(const nlohmann::json& state, std::vector<StateDict>& shards,
                              const std::string& state_path) {
  TS_CHECK(state.is_object() && state.contains("zero") && state["zero"].is_object() &&
               state["zero"].contains("layout"),
           "[checkpoint] ", state_path,
           ": expected $.zero.layout, the layout of the parameter shards");
  const parallel::FlatLayout layout =
      parallel::FlatLayout::from_json(state["zero"]["layout"], state_path + " $.zero.layout");
  TS_CHECK(static_cast<int>(shards.size()) == layout.world, "[checkpoint] ", state_path,
           ": the layout is for ", layout.world, " ranks; expected as many shards, found ",
           shards.size());
  std::vector<Tensor> params;
  for (size_t r = 0; r < shards.size(); ++r) {
    const auto it = parameter_shard_of(shards[r], r);
    params.push_back(it->second);
    shards[r].erase(it);
  }
  StateDict out;
  for (auto& [name, t] : parallel::unshard(layout, params)) out.emplace_back(name, t);
  return out;
}

// Merges the numbered part files i = 0, 1, ... for as long as the manifest lists
// model_name(i): each one's tensors into `model` and, with `with_optimizer`, its
// optimizer_name(i)'s into `optimizer`, skipping keys an earlier part had (a pipeline's tied
// wte is in two parts, equal). Each file is checked against the manifest first.
void merge_part_files(const fs::path& d, const Manifest& manifest,
                      const std::function<std::string(int)>& model_name,
                      const std::function<std::string(int)>& optimizer_name, bool with_optimizer,
                      StateDict& model, StateDict& optimizer) {
  std::set<std::string> seen_model, seen_optimizer;
  const auto merge = [&d](const ManifestEntry& file, StateDict& into, std::set<std::string>& seen) {
    verify_file(d, file);
    for (auto& [key, t] : read_safetensors((d / file.name).string()).tensors) {
      if (seen.insert(key).second) into.emplace_back(key, t);
    }
  };
  for (int i = 0;; ++i) {
    const ManifestEntry* weights = manifest.find(model_name(i));
    if (weights == nullptr) break;
    const ManifestEntry* state = manifest.find(optimizer_name(i));
    TS_CHECK(state != nullptr, "[checkpoint] ", manifest.path.string(), ": lists ", model_name(i),
             " but not ", optimizer_name(i));
    merge(*weights, model, seen_model);
    if (with_optimizer) merge(*state, optimizer, seen_optimizer);
  }
}

// Merges the stage parts of a pipeline checkpoint.
CheckpointContents load_parts(const fs::path& d, const Manifest& manifest, bool with_optimizer) {
  CheckpointContents c;
  c.state = parse_json_file((d / "state.json").string());
  merge_part_files(d, manifest, model_part_name, optimizer_part_name, with_optimizer, c.model,
                   c.optimizer);
  return c;
}

CheckpointContents load_whole_or_shards(const fs::path& d, const Manifest& manifest,
                                        bool with_optimizer, bool whole_weights) {
  auto is_listed = [&](const std::string& f) { return manifest.lists(f); };
  const fs::path& manifest_path = manifest.path;
  const int64_t world = manifest.world;
  // The optimizer: one whole file, or one shard per rank of the saving run. The weights:
  // model.safetensors, or the shards' parameter shards.
  const bool sharded = !is_listed("optimizer.safetensors");
  const bool whole_model = is_listed("model.safetensors");
  if (sharded) {
    for (int r = 0; r < world; ++r) {
      TS_CHECK(is_listed(optimizer_shard_name(r)), "[checkpoint] ", manifest_path.string(),
               ": expected the manifest to list optimizer.safetensors or the ", world,
               " shards of a ", world, "-rank run; ", optimizer_shard_name(r), " is not listed");
    }
  }
  TS_CHECK(whole_model || sharded, "[checkpoint] ", manifest_path.string(),
           ": expected the manifest to list model.safetensors");
  const bool read_shards = sharded && (with_optimizer || !whole_model);
  for (const ManifestEntry& l : manifest.files) {
    const bool whole_optimizer = l.name == "optimizer.safetensors";
    const bool shard = l.name.rfind("zero_pp_rank_", 0) == 0;
    // Per-rank state files are checked by the one rank that reads each, expert parts by
    // load_expert_parts.
    const bool own_reader =
        l.name.rfind("rank_state_", 0) == 0 || l.name.rfind("expp_rank_", 0) == 0;
    if ((whole_optimizer && !with_optimizer) || (shard && !read_shards) || own_reader) continue;
    verify_file(d, l);
  }
  CheckpointContents c;
  c.state = parse_json_file((d / "state.json").string());
  if (whole_model) c.model = read_safetensors((d / "model.safetensors").string()).tensors;
  if (with_optimizer && !sharded) {
    c.optimizer = read_safetensors((d / "optimizer.safetensors").string()).tensors;
  }
  if (!read_shards) return c;
  std::vector<StateDict> shards;
  for (int r = 0; r < world; ++r) {
    shards.push_back(read_safetensors((d / optimizer_shard_name(r)).string()).tensors);
  }
  if (!whole_model && (whole_weights || !with_optimizer)) {
    c.model = weights_from_shards(c.state, shards, (d / "state.json").string());
  } else if (!whole_model) {
    // Left in the shards for the engine, but there: a checkpoint without them is refused
    // here, where the resume can fall back to an older one (Note [Resume fallback]).
    for (size_t r = 0; r < shards.size(); ++r) parameter_shard_of(shards[r], r);
  }
  if (with_optimizer) c.optimizer_shards = std::move(shards);
  return c;
}

// Reads the expert parts (Note [Expert checkpoints] in parallel/engine/engine.h) into `c`:
// the weights into `experts` (into `model` with `whole_weights`), the optimizer state into
// `expert_optimizer` (`with_optimizer` only). Each file is checked against the manifest.
void load_expert_parts(const fs::path& d, const Manifest& manifest, bool with_optimizer,
                       bool whole_weights, CheckpointContents& c) {
  merge_part_files(d, manifest, expert_model_name, expert_optimizer_name, with_optimizer,
                   whole_weights ? c.model : c.experts, c.expert_optimizer);
}

// Every expert part's files when this run has any (then every part is written).
void add_expert_files(const CheckpointContents& contents, std::vector<std::string>& files) {
  for (int e = 0; e < contents.expert_parts; ++e) {
    files.push_back(expert_model_name(e));
    files.push_back(expert_optimizer_name(e));
  }
}

// Every rank's rank_state_<r> file when this rank has per-rank state (then all do).
void add_rank_state_files(const CheckpointContents& contents, int world,
                          std::vector<std::string>& files) {
  if (contents.rank_state.empty()) return;
  for (int r = 0; r < world; ++r) files.push_back(rank_state_name(r));
}

}  // namespace

CheckpointDir::CheckpointDir(std::string root, int64_t keep_last)
    : root_(std::move(root)), keep_last_(keep_last) {}

std::string CheckpointDir::save(int64_t step, const CheckpointContents& contents,
                                parallel::Communicator* comm) const {
  const int rank = comm ? comm->rank() : 0;
  const int world = comm ? comm->size() : 1;
  const bool leader = rank == 0;
  auto barrier = [comm] {
    if (comm) comm->barrier();
  };
  const fs::path root(root_);
  const std::string name = step_name(step);
  const fs::path tmp = root / ("." + name + ".tmp");
  const fs::path final_dir = root / name;
  if (leader) {
    fs::create_directories(root);
    // Leftovers of saves that crashed before their rename.
    for (const fs::directory_entry& e : fs::directory_iterator(root)) {
      const std::string entry = e.path().filename().string();
      if (entry.rfind(".step_", 0) == 0) fs::remove_all(e.path());
    }
    fs::create_directories(tmp);
  }
  barrier();  // the directory exists
  if (!contents.rank_state.empty()) {
    write_safetensors((tmp / rank_state_name(rank)).string(), contents.rank_state);
  }
  if (contents.expert_part >= 0) {
    write_safetensors((tmp / expert_model_name(contents.expert_part)).string(), contents.experts);
    write_safetensors((tmp / expert_optimizer_name(contents.expert_part)).string(),
                      contents.expert_optimizer);
  }
  if (contents.parts > 0) return save_parts(step, contents, comm, tmp, final_dir);
  const bool sharded = !contents.optimizer_shard.empty();
  if (sharded)
    write_streamed_safetensors((tmp / optimizer_shard_name(rank)).string(),
                               contents.optimizer_shard);
  std::vector<std::string> files = {"state.json"};
  if (leader && !contents.model.empty()) {
    files.push_back("model.safetensors");
    write_safetensors((tmp / "model.safetensors").string(), contents.model);
  }
  if (leader) {
    write_file_atomically((tmp / "state.json").string(), {contents.state.dump(1) + "\n"});
    if (!sharded) {
      write_safetensors((tmp / "optimizer.safetensors").string(), contents.optimizer);
    }
  }
  barrier();  // every file is written
  if (leader) {
    if (sharded) {
      for (int r = 0; r < world; ++r) files.push_back(optimizer_shard_name(r));
    } else {
      files.push_back("optimizer.safetensors");
    }
    add_expert_files(contents, files);
    add_rank_state_files(contents, world, files);
    commit(step, world, files, tmp, final_dir);
  }
  barrier();  // committed: every rank may read it
  return final_dir.string();
}

std::string CheckpointDir::save_parts(int64_t step, const CheckpointContents& contents,
                                      parallel::Communicator* comm, const fs::path& tmp,
                                      const fs::path& final_dir) const {
  const int rank = comm ? comm->rank() : 0;
  const int world = comm ? comm->size() : 1;
  if (contents.part >= 0) {
    write_safetensors((tmp / model_part_name(contents.part)).string(), contents.model);
    write_safetensors((tmp / optimizer_part_name(contents.part)).string(), contents.optimizer);
  }
  if (rank == 0) {
    write_file_atomically((tmp / "state.json").string(), {contents.state.dump(1) + "\n"});
  }
  if (comm) comm->barrier();  // every file is written
  if (rank == 0) {
    std::vector<std::string> files = {"state.json"};
    for (int s = 0; s < contents.parts; ++s) {
      files.push_back(model_part_name(s));
      files.push_back(optimizer_part_name(s));
    }
    add_rank_state_files(contents, world, files);
    commit(step, world, files, tmp, final_dir);
  }
  if (comm) comm->barrier();  // committed
  return final_dir.string();
}

void CheckpointDir::commit(int64_t step, int world, const std::vector<std::string>& files,
                           const fs::path& tmp, const fs::path& final_dir) const {
  write_manifest(tmp, step, world, files);
  fsync_directory(tmp.string());
  if (fs::exists(final_dir)) fs::remove_all(final_dir);  // a re-save of the same step
  fs::rename(tmp, final_dir);
  const fs::path root = final_dir.parent_path();
  fsync_directory(root.string());
  write_file_atomically((root / "latest").string(), {step_name(step) + "\n"});
  prune();
}

void CheckpointDir::prune() const {
  if (keep_last_ <= 0) return;
  const std::vector<int64_t> steps = committed_steps(root_);
  const std::optional<std::string> newest = latest();
  for (size_t i = 0; i + static_cast<size_t>(keep_last_) < steps.size(); ++i) {
    const fs::path dir = fs::path(root_) / step_name(steps[i]);
    if (newest && fs::path(*newest) == dir) continue;
    fs::remove_all(dir);
  }
}

std::vector<std::string> CheckpointDir::resume_candidates(std::string* note) const {
  note->clear();
  std::optional<std::string> pointed;
  try {
    pointed = latest();
  } catch (const Error& e) {
    *note = e.what();
  }
  std::vector<std::string> out;
  if (pointed) out.push_back(*pointed);
  const std::vector<int64_t> steps = committed_steps(root_);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const std::string dir = (fs::path(root_) / step_name(*it)).string();
    if (!pointed || fs::path(dir) != fs::path(*pointed)) out.push_back(dir);
  }
  if (!pointed && note->empty() && !out.empty()) {
    *note = str_cat("[checkpoint] ", (fs::path(root_) / "latest").string(),
                    " is missing; resuming from the newest committed step");
  }
  if (out.empty()) note->clear();
  return out;
}

std::optional<std::pair<std::string, CheckpointContents>> CheckpointDir::load_newest(
    int rank_state_of, const std::function<void(const std::string&)>& warn) const {
  std::string note;
  const std::vector<std::string> candidates = resume_candidates(&note);
  if (!note.empty()) warn(note);
  std::string first_problem;
  for (const std::string& dir : candidates) {
    try {
      return std::make_pair(dir, load_checkpoint(dir, /*with_optimizer=*/true, rank_state_of,
                                                 /*whole_weights=*/false));
    } catch (const Error& e) {
      if (first_problem.empty()) first_problem = e.what();
      warn(str_cat("[train] cannot resume from ", dir, ": ", e.what(),
                   "; trying the previous committed checkpoint"));
    }
  }
  TS_CHECK(first_problem.empty(), "[train] no checkpoint in ", root_,
           " loads (the newest: ", first_problem,
           "); expected one that does, or --no-resume to start over");
  return std::nullopt;
}

void CheckpointDir::check_writable(int rank) const {
  const fs::path probe = fs::path(root_) / (".write_test.rank" + std::to_string(rank));
  std::error_code ec;
  fs::create_directories(root_, ec);
  TS_CHECK(!ec, "[train] trainer.checkpoint_dir: expected a directory that can be created, found ",
           root_, " (", ec.message(), ")");
  {
    std::ofstream out(probe, std::ios::trunc);
    out << "tessera\n";
    out.close();
    TS_CHECK(out.good(), "[train] trainer.checkpoint_dir: expected a writable directory, found ",
             root_, " (cannot write ", probe.string(), ")");
  }
  fs::remove(probe, ec);
}

std::optional<std::string> CheckpointDir::latest() const {
  const fs::path pointer = fs::path(root_) / "latest";
  if (!fs::exists(pointer)) return std::nullopt;
  std::ifstream in(pointer);
  std::string name;
  std::getline(in, name);
  const fs::path dir = fs::path(root_) / name;
  TS_CHECK(!name.empty() && name.find('/') == std::string::npos && fs::is_directory(dir),
           "[checkpoint] ", pointer.string(), " names \"", name,
           "\"; expected a checkpoint directory beside it");
  return dir.string();
}

CheckpointContents load_checkpoint(const std::string& dir, bool with_optimizer, int rank_state_of,
                                   bool whole_weights) {
  const fs::path d(dir);
  const Manifest manifest = read_manifest(d);
  TS_CHECK(manifest.lists("state.json"), "[checkpoint] ", manifest.path.string(),
           ": expected the manifest to list state.json");
  StateDict rank_state;
  if (with_optimizer && rank_state_of >= 0) {
    if (const ManifestEntry* e = manifest.find(rank_state_name(rank_state_of))) {
      verify_file(d, *e);
      rank_state = read_safetensors((d / e->name).string()).tensors;
    }
  }
  CheckpointContents c = manifest.lists(model_part_name(0))
                             ? load_parts(d, manifest, with_optimizer)
                             : load_whole_or_shards(d, manifest, with_optimizer, whole_weights);
  load_expert_parts(d, manifest, with_optimizer, whole_weights || !with_optimizer, c);
  c.rank_state = std::move(rank_state);
  return c;
}

std::string resolve_checkpoint_dir(const std::string& path) {
  const fs::path p(path);
  TS_CHECK(fs::is_directory(p), "[checkpoint] ", path, ": expected a checkpoint directory, found ",
           fs::exists(p) ? "a file" : "nothing");
  if (fs::exists(p / "manifest.json")) return path;
  if (fs::exists(p / "latest")) return *CheckpointDir(path, 0).latest();
  TS_FAIL("[checkpoint] ", path,
          ": expected a checkpoint step directory (with manifest.json) or a checkpoint root "
          "(with latest), found neither");
}

void check_same_checkpoint(parallel::Communicator& world, int64_t step, const std::string& root) {
  // [max, -min] in one reduction.
  const Tensor agree = from_vector(std::vector<int64_t>{step, -step}, {2});
  world.all_reduce(agree, parallel::ReduceOp::max);
  const std::vector<int64_t> steps = agree.to_vector<int64_t>();
  TS_CHECK(steps[0] == -steps[1], "[train] rank ", world.rank(), " found ",
           step >= 0 ? "checkpoint step " + std::to_string(step) : std::string("no checkpoint"),
           " in ", root, ", but the ranks' latest steps range from ", -steps[1], " to ", steps[0],
           " (-1: none); expected every rank to see the same checkpoint");
}

int64_t checkpoint_step(const std::string& dir) {
  const std::string name = fs::path(dir).filename().string();
  long long step = 0;
  char tail = 0;
  TS_CHECK(std::sscanf(name.c_str(), "step_%lld%c", &step, &tail) == 1 && name == step_name(step),
           "[checkpoint] ", dir, ": expected a directory named step_<8 digits>");
  return step;
}

std::string optimizer_shard_name(int rank) {
  return "zero_pp_rank_" + std::to_string(rank) + "_mp_rank_00_optim_states.safetensors";
}

std::string expert_model_name(int ep_rank) {
  return "expp_rank_" + std::to_string(ep_rank) + "_model_states.safetensors";
}

std::string expert_optimizer_name(int ep_rank) {
  return "expp_rank_" + std::to_string(ep_rank) + "_optim_states.safetensors";
}

std::string rank_state_name(int rank) {
  return "rank_state_" + std::to_string(rank) + ".safetensors";
}

std::string model_part_name(int stage) {
  return "model_part_" + std::to_string(stage) + ".safetensors";
}

std::string optimizer_part_name(int stage) {
  return "optimizer_part_" + std::to_string(stage) + ".safetensors";
}

}  // namespace tessera::train
