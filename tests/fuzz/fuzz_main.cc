// The driver of a reader's fuzz test (Note [Reader fuzzing] in tests/fuzz/fuzz_target.h):
//
//   <target>_fuzz_test --corpus DIR [--seconds S] [--mutants N]
//
// reads every seed in DIR, then mutants until S seconds (default 10) or N mutants have
// run. Exit code 0 when every input was accepted or rejected with a one-line
// tessera::Error, or with a list of problems (Note [One pass] in core/json.h: "[config] 3
// problems:", then one indented line each, and at most one closing line); 1, naming the
// input and keeping it in <outputs>/<target>.current, otherwise.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include "core/error.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/mutator.h"

namespace tessera::fuzz {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The longest error message a reader may give: it names what was wrong (and may list what
// is valid), but does not echo a long input.
constexpr size_t kMaxMessage = 2000;

struct Options {
  fs::path corpus;
  double seconds = 10;
  int64_t mutants = -1;  // no limit
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "fuzz: %s\nusage: fuzz --corpus DIR [--seconds S] [--mutants N]\n",
               why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage("expected a value after " + flag);
    const std::string value = argv[++i];
    if (flag == "--corpus") {
      o.corpus = value;
    } else if (flag == "--seconds") {
      o.seconds = std::atof(value.c_str());
    } else if (flag == "--mutants") {
      o.mutants = std::atoll(value.c_str());
    } else {
      usage("unknown flag " + flag);
    }
  }
  if (o.corpus.empty()) usage("expected --corpus DIR");
  return o;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The seed files of `dir`, by name.
std::vector<std::pair<std::string, std::string>> load_corpus(const fs::path& dir) {
  std::vector<std::pair<std::string, std::string>> seeds;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) seeds.emplace_back(e.path().filename().string(), read_bytes(e.path()));
  }
  std::sort(seeds.begin(), seeds.end());
  if (seeds.empty()) usage("expected seed files in " + dir.string() + ", found none");
  return seeds;
}

fs::path env_dir(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? fs::path(v) : fs::temp_directory_path();
}

// Keeps the input being read in a file, so that a crash leaves it behind.
class CurrentInput {
 public:
  explicit CurrentInput(fs::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd_ < 0) usage("cannot write " + path_.string());
  }
  ~CurrentInput() {
    ::close(fd_);
    if (clean_) fs::remove(path_);
  }
  void set(const std::string& bytes) {
    const bool ok = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, bytes.data(), bytes.size(), 0) ==
                                                    static_cast<ssize_t>(bytes.size());
    if (!ok) usage("cannot write " + path_.string());
  }
  void keep() { clean_ = false; }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
  int fd_ = -1;
  bool clean_ = true;
};

// Whether `what` lists problems as Note [One pass] in core/json.h says: "[component] N
// problems...:", N lines indented by two spaces, and at most one closing line.
bool problem_list(const std::string& what) {
  std::vector<std::string> lines;
  std::istringstream in(what);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  if (lines.size() < 3 || lines[0].empty() || lines[0].front() != '[' || lines[0].back() != ':') {
    return false;
  }
  const size_t count_at = lines[0].find("] ");
  if (count_at == std::string::npos) return false;
  const long count = std::strtol(lines[0].c_str() + count_at + 2, nullptr, 10);
  size_t listed = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    if (lines[i].size() > kMaxMessage) return false;
    if (lines[i].rfind("  ", 0) == 0 && lines[i].size() > 2) {
      ++listed;
    } else if (i + 1 != lines.size() || lines[i].empty()) {
      return false;  // only the last line may be a closing remark
    }
  }
  return count >= 2 && listed == static_cast<size_t>(count);
}

// Why reading `input` broke the reader's promise, or nullopt when it kept it.
std::optional<std::string> broken_promise(const FuzzTarget& target, const std::string& input,
                                          bool& accepted) {
  try {
    target.read(input);
    accepted = true;
    return std::nullopt;
  } catch (const Error& e) {
    accepted = false;
    const std::string what = e.what();
    if (what.empty()) return "a tessera::Error with an empty message";
    if (what.find('\n') != std::string::npos && !problem_list(what)) {
      return "a tessera::Error of several lines that is no problem list: " + what;
    }
    if (what.find('\n') == std::string::npos && what.size() > kMaxMessage) {
      return "a tessera::Error of " + std::to_string(what.size()) + " characters (at most " +
             std::to_string(kMaxMessage) + "): " + what.substr(0, 300) + "...";
    }
    return std::nullopt;
  } catch (const std::exception& e) {
    return std::string("an exception of type ") + typeid(e).name() +
           " instead of a tessera::Error: " + e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

int run(int argc, char** argv) {
  const Options options = parse(argc, argv);
  const std::string name = options.corpus.filename().string();
  const fs::path work = env_dir("TEST_TMPDIR") / ("fuzz_" + name);
  fs::remove_all(work);
  fs::create_directories(work);
  const FuzzTarget target = make_fuzz_target(work);
  const std::vector<std::pair<std::string, std::string>> seeds = load_corpus(options.corpus);
  CurrentInput current(env_dir("TEST_UNDECLARED_OUTPUTS_DIR") / (name + ".current"));

  int64_t inputs = 0, accepted_count = 0;
  const auto check = [&](const std::string& input, const std::string& what) {
    current.set(input);
    bool accepted = false;
    if (const std::optional<std::string> why = broken_promise(target, input, accepted)) {
      current.keep();
      std::fprintf(stderr, "FAIL: %s: %s (%zu bytes, kept in %s): %s\n", name.c_str(), what.c_str(),
                   input.size(), current.path().c_str(), why->c_str());
      return false;
    }
    ++inputs;
    accepted_count += accepted ? 1 : 0;
    return true;
  };

  for (const auto& [file, bytes] : seeds) {
    if (!check(bytes, "seed " + file)) return 1;
  }
  std::vector<std::string> seed_bytes;
  for (const auto& [file, bytes] : seeds) seed_bytes.push_back(bytes);
  Mutator mutator(std::move(seed_bytes), target.dictionary, /*seed=*/20261126);
  const Clock::time_point start = Clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  int64_t mutants = 0;
  while ((options.mutants < 0 || mutants < options.mutants) && elapsed() < options.seconds) {
    if (!check(mutator.next(), "mutant " + std::to_string(mutants))) return 1;
    ++mutants;
  }
  std::printf(
      "%s: %lld inputs (%zu seeds, %lld mutants) in %.1f s: %lld accepted, %lld rejected "
      "with a one-line error\n",
      name.c_str(), static_cast<long long>(inputs), seeds.size(), static_cast<long long>(mutants),
      elapsed(), static_cast<long long>(accepted_count),
      static_cast<long long>(inputs - accepted_count));
  return 0;
}

}  // namespace
}  // namespace tessera::fuzz

int main(int argc, char** argv) { return tessera::fuzz::run(argc, argv); }
