#include "tools/trainer/csv_monitor.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

#include "core/error.h"

namespace tessera::train {
namespace fs = std::filesystem;
namespace {

// The rows of an existing monitor file with steps up to `keep_through`, or nullopt when the
// file is not one (Note [CSV monitor files]).
std::optional<std::vector<std::string>> kept_rows(const fs::path& path, int64_t keep_through) {
  std::ifstream in(path, std::ios::binary);
  std::string line;
  if (!std::getline(in, line) || line.rfind("step,", 0) != 0) return std::nullopt;
  std::vector<std::string> rows = {line};
  while (std::getline(in, line)) {
    int64_t step = -1;
    const char* const last = line.data() + line.size();
    const auto [comma, ec] = std::from_chars(line.data(), last, step);
    if (ec == std::errc() && comma != last && *comma == ',' && step <= keep_through) {
      rows.push_back(line);
    }
  }
  return rows;
}

// A tag's file name without ".csv": '/' and ' ' made '_'.
std::string file_stem(const std::string& tag) {
  std::string name = tag;
  for (char& c : name) {
    if (c == '/' || c == ' ') c = '_';
  }
  return name;
}

}  // namespace

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  // Shortest round-trip digits, as d.ddde[+-]XX.
  char buf[64];
  const auto [end, ec] =
      std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  TS_INTERNAL_ASSERT(ec == std::errc(), "to_chars failed for ", value);
  const std::string s(buf, end);
  const size_t e = s.find('e');
  const bool negative = s[0] == '-';
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i) {
    if (s[i] != '.') digits.push_back(s[i]);
  }
  const int exponent = std::atoi(s.c_str() + e + 1);
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(-exponent - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out += digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp[16];
  std::snprintf(exp, sizeof(exp), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp;
}

std::string CsvMonitor::file_name(const std::string& tag) { return file_stem(tag) + ".csv"; }

CsvMonitor::CsvMonitor(const std::string& dir, const std::string& tag_prefix, int64_t keep_through,
                       const std::vector<std::string>& written_before_step)
    : dir_(dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TS_CHECK(!ec, "[csv_monitor] cannot create the folder ", dir, ": ", ec.message());
  const std::string stem = file_stem(tag_prefix);
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || entry.path().extension() != ".csv" ||
        name.rfind(stem, 0) != 0) {
      continue;
    }
    bool early = false;
    for (const std::string& tag : written_before_step) early |= file_name(tag) == name;
    const std::optional<std::vector<std::string>> rows =
        kept_rows(entry.path(), early ? keep_through - 1 : keep_through);
    if (!rows) continue;
    if (keep_through < 0) {
      fs::remove(entry.path());
      continue;
    }
    // Rewritten beside and renamed over, so a crash leaves the old file or the new one.
    const fs::path tmp = entry.path().string() + ".tmp";
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    for (const std::string& row : *rows) out << row << '\n';
    out.close();
    TS_CHECK(!out.fail(), "[csv_monitor] cannot write ", tmp.string(), " (disk full?)");
    fs::rename(tmp, entry.path());
  }
}

void CsvMonitor::write(const std::string& tag, double value, int64_t step) {
  const fs::path path = fs::path(dir_) / file_name(tag);
  const bool header = !fs::exists(path);
  std::ofstream out(path, std::ios::binary | std::ios::app);
  TS_CHECK(out.good(), "[csv_monitor] cannot open ", path.string(), " for appending");
  if (header) out << "step," << tag.substr(tag.rfind('/') + 1) << "\r\n";
  out << step << ',' << python_float_repr(value) << "\r\n";
  out.close();
  TS_CHECK(!out.fail(), "[csv_monitor] writing ", path.string(), " failed (disk full?)");
}

}  // namespace tessera::train
