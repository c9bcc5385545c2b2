// A PyTorch reference that runs once as a child process and prints one JSON line: how the
// GPU benchmarks (gpt2_gpu_bench, cuda_kernels_bench) find their scripts and read them.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace tessera::bench {

// `flag` when given; else the first existing file named `name` beside the binary (the GPU
// bundle of tools/gpu/pack.sh), in the workspace of `bazel run`, in the runfiles, or
// under tools/bench/ of the working directory; else that last path.
std::string find_script(const std::optional<std::string>& flag, const char* argv0,
                        const std::string& name);

struct ScriptResult {
  std::optional<nlohmann::json> json;  // the last output line that is an object holding `key`
  std::string why;                     // when there is none: the exit status and output's tail
};

// Runs `python script args` (args already quoted for the shell) and reads its result line.
ScriptResult run_script(const std::string& python, const std::string& script,
                        const std::string& args, const char* key);

// The number under `key` of a result, or NaN when it is absent.
double json_number(const std::optional<nlohmann::json>& json, const char* key);

}  // namespace tessera::bench
