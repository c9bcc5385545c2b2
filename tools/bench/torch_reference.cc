#include "tools/bench/torch_reference.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace tessera::bench {
namespace {

// The last `keep` characters of text on one line.
std::string tail(std::string text, size_t keep = 400) {
  if (text.size() > keep) text = text.substr(text.size() - keep);
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text.empty() ? "(no output)" : text;
}

}  // namespace

TorchReference::TorchReference(const TorchReferenceOptions& o) {
  if (::access(o.script.c_str(), R_OK) != 0) {
    why_ = "no script at " + o.script;
    return;
  }
  // Writing to a reference that died must fail the write, not kill the bench.
  std::signal(SIGPIPE, SIG_IGN);
  int to[2], from[2];
  if (::pipe(to) != 0 || ::pipe(from) != 0) {
    why_ = std::string("cannot create pipes: ") + std::strerror(errno);
    return;
  }
  const std::vector<std::string> args = {o.python,
                                         o.script,
                                         "--serve",
                                         "--batch",
                                         std::to_string(o.batch),
                                         "--seq",
                                         std::to_string(o.seq),
                                         "--warmup",
                                         std::to_string(o.warmup),
                                         "--threads",
                                         std::to_string(o.threads),
                                         "--dtype",
                                         o.dtype};
  // Our environment with the reference's settings; built before fork, since the child of a
  // threaded process may only make async-signal-safe calls until it execs.
  std::vector<std::string> env = {"OPENBLAS_CORETYPE=SKYLAKEX",
                                  "OMP_NUM_THREADS=" + std::to_string(o.threads)};
  if (!o.blas_dir.empty()) env.push_back("LD_LIBRARY_PATH=" + o.blas_dir);
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    const std::string name = var.substr(0, var.find('='));
    if (name != "OPENBLAS_CORETYPE" && name != "OMP_NUM_THREADS" &&
        (o.blas_dir.empty() || name != "LD_LIBRARY_PATH")) {
      env.push_back(var);
    }
  }
  const auto pointers = [](const std::vector<std::string>& strings) {
    std::vector<char*> out;
    for (const std::string& s : strings) out.push_back(const_cast<char*>(s.c_str()));
    out.push_back(nullptr);
    return out;
  };
  const std::vector<char*> argv = pointers(args), envp = pointers(env);
  const std::string exec_failed = "cannot run " + o.python + "\n";
  pid_ = ::fork();
  if (pid_ == 0) {  // the child: stdin from `to`, stdout and stderr into `from`
    ::dup2(to[0], STDIN_FILENO);
    ::dup2(from[1], STDOUT_FILENO);
    ::dup2(from[1], STDERR_FILENO);
    for (int fd : {to[0], to[1], from[0], from[1]}) ::close(fd);
    ::execve(o.python.c_str(), argv.data(), envp.data());
    [[maybe_unused]] const ssize_t n =
        ::write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
    ::_exit(127);
  }
  ::close(to[0]);
  ::close(from[1]);
  to_child_ = to[1];
  from_child_ = ::fdopen(from[0], "r");
  if (pid_ < 0 || from_child_ == nullptr) {
    fail(std::string("cannot start ") + o.python + ": " + std::strerror(errno));
    return;
  }
  if (std::optional<nlohmann::json> ready = read_tagged("TORCH_READY")) meta_ = *ready;
}

TorchReference::~TorchReference() { close_session(); }

std::optional<nlohmann::json> TorchReference::steps(int64_t n) {
  if (!ok() || !send("steps " + std::to_string(n) + "\n")) return std::nullopt;
  return read_tagged("TORCH_STEPS");
}

std::optional<nlohmann::json> TorchReference::finish() {
  if (!ok() || !send("done\n")) return std::nullopt;
  std::optional<nlohmann::json> result = read_tagged("TORCH_RESULT");
  close_session();
  return result;
}

std::optional<nlohmann::json> TorchReference::read_tagged(const std::string& tag) {
  std::array<char, 1 << 16> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), from_child_) != nullptr) {
    const std::string line = buf.data();
    if (line.rfind(tag + " ", 0) == 0) {
      try {
        return nlohmann::json::parse(line.substr(tag.size() + 1));
      } catch (const nlohmann::json::exception& e) {
        fail("unreadable " + tag + " line: " + e.what());
        return std::nullopt;
      }
    }
    output_ += line;
  }
  fail("the script ended before its " + tag + " line");
  return std::nullopt;
}

bool TorchReference::send(const std::string& line) {
  if (::write(to_child_, line.data(), line.size()) == static_cast<ssize_t>(line.size())) {
    return true;
  }
  fail(std::string("cannot write to it: ") + std::strerror(errno));
  return false;
}

void TorchReference::fail(const std::string& what) {
  if (!ok()) return;
  why_ = what;
  close_session();  // adds the exit status
  why_ += ": " + tail(output_);
}

void TorchReference::close_session() {
  if (to_child_ >= 0) ::close(to_child_);  // end of stdin: the script stops
  to_child_ = -1;
  if (from_child_ != nullptr) {
    std::array<char, 4096> buf{};
    while (std::fgets(buf.data(), static_cast<int>(buf.size()), from_child_) != nullptr) {
      output_ += buf.data();
    }
    std::fclose(from_child_);
  }
  from_child_ = nullptr;
  if (pid_ > 0) {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    if (!ok() && WIFEXITED(status))
      why_ += " (exit status " + std::to_string(WEXITSTATUS(status)) + ")";
  }
  pid_ = -1;
}

}  // namespace tessera::bench
