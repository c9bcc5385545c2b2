#include "tools/cli/flags.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "core/error.h"

namespace tessera::cli {

Flags::Flags(int argc, char** argv, const std::vector<Flag>& known) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      values_["help"] = "";
      continue;
    }
    if (arg.rfind("--", 0) != 0) throw UsageError("unexpected argument \"" + arg + "\"");
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const Flag* flag = nullptr;
    for (const Flag& f : known) {
      if (f.name == name) flag = &f;
    }
    if (flag == nullptr) throw UsageError("unknown flag --" + name);
    if (values_.count(name)) throw UsageError("--" + name + " given twice");
    if (flag->kind == Flag::kSwitch) {
      if (eq != std::string::npos) throw UsageError("--" + name + " takes no value");
      values_[name] = "";
    } else if (eq != std::string::npos) {
      values_[name] = arg.substr(eq + 1);
    } else {
      if (i + 1 >= argc) throw UsageError("--" + name + " expects a value");
      values_[name] = argv[++i];
    }
  }
}

std::optional<std::string> Flags::get(const std::string& name) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Flags::get(const std::string& name, const std::string& fallback) const {
  return get(name).value_or(fallback);
}

std::string Flags::required(const std::string& name) const {
  const std::optional<std::string> v = get(name);
  if (!v) throw UsageError("--" + name + " is required");
  return *v;
}

namespace {

// The whole of `text` as an integer, if it is one.
std::optional<int64_t> parse_int(const std::string& text) {
  size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used == 0 || used != text.size()) return std::nullopt;
  return n;
}

}  // namespace

int64_t Flags::get_int(const std::string& name, int64_t fallback) const {
  const std::optional<std::string> v = get(name);
  if (!v) return fallback;
  const std::optional<int64_t> n = parse_int(*v);
  if (!n) throw UsageError("--" + name + " expected an integer, found \"" + *v + "\"");
  return *n;
}

std::vector<int64_t> Flags::get_int_list(const std::string& name,
                                         const std::string& fallback) const {
  const std::string text = get(name, fallback);
  std::vector<int64_t> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    const std::optional<int64_t> n = parse_int(text.substr(start, comma - start));
    if (!n) {
      throw UsageError("--" + name + " expected integers separated by commas, found \"" + text +
                       "\"");
    }
    out.push_back(*n);
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

double Flags::get_double(const std::string& name, double fallback) const {
  const std::optional<std::string> v = get(name);
  if (!v) return fallback;
  size_t used = 0;
  double d = 0;
  try {
    d = std::stod(*v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v->size()) {
    throw UsageError("--" + name + " expected a number, found \"" + *v + "\"");
  }
  return d;
}

void enter_working_directory() {
  const char* dir = std::getenv("BUILD_WORKING_DIRECTORY");
  if (dir != nullptr && ::chdir(dir) != 0) {
    throw std::runtime_error(std::string("cannot enter the working directory ") + dir);
  }
}

int run_tool(const char* tool, const char* usage, int (*body)(int argc, char** argv), int argc,
             char** argv) {
  try {
    return body(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n\n%s", tool, e.what(), usage);
    return 2;
  } catch (const NoDeviceError& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
    return kExitNoDevice;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
    return 1;
  }
}

}  // namespace tessera::cli
