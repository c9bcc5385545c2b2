// report: one self-contained HTML page with plots of training runs' metrics (loss and
// val_loss, learning rate, gradient norm, throughput, MFU), several runs compared on the same
// axes (tools/report/report.h).
//
//   bazel run //tools/report -- .runs/shakespeare_char
//   bazel run //tools/report -- --out compare.html .runs/a .runs/b
//
// Exit codes: 0 done, 2 bad arguments, 1 any other error (a bad metrics.jsonl names its line).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "tools/cli/flags.h"
#include "tools/report/report.h"

namespace {

constexpr const char* kUsage =
    R"(usage: report [--out FILE] RUN_DIR [RUN_DIR ...]

Writes one HTML page with plots of the runs' metrics.jsonl, the runs compared on each chart.

  RUN_DIR      a run's log directory, holding metrics.jsonl
  --out FILE   the page to write (default: report.html in the first RUN_DIR)
)";

// Splits the command line into the flags, for cli::Flags (argv[0] first, "--out" with its
// value), and the run directories: Flags takes no positional arguments. After "--" every
// argument is a directory.
std::vector<std::string> split_args(int argc, char** argv, std::vector<char*>& flag_args) {
  std::vector<std::string> dirs;
  flag_args = {argv[0]};
  bool only_dirs = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (only_dirs || arg.empty() || arg[0] != '-') {
      dirs.push_back(arg);
    } else if (arg == "--") {
      only_dirs = true;
    } else {
      flag_args.push_back(argv[i]);
      if (arg == "--out" && i + 1 < argc) flag_args.push_back(argv[++i]);
    }
  }
  return dirs;
}

// Writes `text` to `path` through a temporary file, so a failed write leaves no half page.
void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    TS_CHECK(out.good(), "[report] ", path, ": cannot be written");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  TS_CHECK(!ec, "[report] ", path, ": cannot be written (", ec.message(), ")");
}

int body(int argc, char** argv) {
  using namespace tessera;
  std::vector<char*> flag_args;
  const std::vector<std::string> dirs = split_args(argc, argv, flag_args);
  const cli::Flags flags(static_cast<int>(flag_args.size()), flag_args.data(),
                         {{"out", cli::Flag::kValue}});
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (dirs.empty()) throw cli::UsageError("expected at least one RUN_DIR");
  cli::enter_working_directory();
  const std::string out =
      flags.get("out", (std::filesystem::path(dirs[0]) / "report.html").string());
  const std::vector<std::string> names = report::run_names(dirs);
  std::vector<report::RunSeries> runs;
  for (size_t i = 0; i < dirs.size(); ++i) runs.push_back(report::read_run(dirs[i], names[i]));
  write_file(out, report::render_html(runs));
  std::printf("report: wrote %s (%zu runs, %zu charts)\n", out.c_str(), runs.size(),
              report::chart_metrics(runs).size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return tessera::cli::run_tool("report", kUsage, body, argc, argv);
}
