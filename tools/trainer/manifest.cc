#include "tools/trainer/manifest.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/file_io.h"
#include "core/json.h"

namespace tessera::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFormat = "tessera-checkpoint";
constexpr int64_t kVersion = 1;

// The longest file name Linux file systems hold (NAME_MAX).
constexpr size_t kMaxFileName = 255;

// True for a name that stays inside its directory: one path component, not "." or "..",
// of printable characters.
bool is_plain_name(const std::string& name) {
  return !name.empty() && name.size() <= kMaxFileName && name != "." && name != ".." &&
         name.find('/') == std::string::npos && std::none_of(name.begin(), name.end(), [](char c) {
           return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
         });
}

// `name` for a message, as a JSON string (control characters escaped), at most
// kMaxFileName bytes of it.
std::string shown_name(const std::string& name) {
  const std::string shown = nlohmann::json(name.substr(0, kMaxFileName))
                                .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return name.size() <= kMaxFileName ? shown : str_cat(shown, "... (", name.size(), " bytes)");
}

void check_listed_files(const fs::path& d, const fs::path& manifest_path,
                        const std::vector<ManifestEntry>& listed) {
  std::set<std::string> names;
  for (const ManifestEntry& l : listed) {
    TS_CHECK(is_plain_name(l.name) && l.name != "manifest.json", "[checkpoint] ",
             manifest_path.string(), ": lists ", shown_name(l.name),
             "; expected the name of a file inside the checkpoint directory (one path "
             "component of at most ",
             kMaxFileName, " bytes)");
    TS_CHECK(names.insert(l.name).second, "[checkpoint] ", manifest_path.string(), ": lists \"",
             l.name, "\" twice; expected each file once");
    std::error_code error;
    const fs::file_status status = fs::symlink_status(d / l.name, error);
    TS_CHECK(!error || status.type() == fs::file_type::not_found, "[checkpoint] ",
             (d / l.name).string(), ": cannot stat: ", error.message());
    TS_CHECK(!fs::exists(status) || fs::is_regular_file(status), "[checkpoint] ",
             (d / l.name).string(), ": expected a regular file, found ",
             fs::is_symlink(status) ? "a symbolic link" : "another kind of file");
  }
  for (const fs::directory_entry& e : fs::directory_iterator(d)) {
    const std::string name = e.path().filename().string();
    TS_CHECK(name == "manifest.json" || names.count(name) > 0, "[checkpoint] ", e.path().string(),
             " is not listed in the manifest; expected the checkpoint to hold exactly the "
             "manifest's files");
  }
}

}  // namespace

void verify_file(const fs::path& d, const ManifestEntry& l) {
  const fs::path p = d / l.name;
  TS_CHECK(fs::exists(p), "[checkpoint] ", p.string(), " is listed in the manifest but missing");
  const int64_t size = static_cast<int64_t>(fs::file_size(p));
  TS_CHECK(size == l.bytes, "[checkpoint] ", p.string(), ": expected ", l.bytes,
           " bytes (manifest), found ", size);
  const std::string found = file_fnv1a64(p.string());
  TS_CHECK(found == l.hash, "[checkpoint] ", p.string(), ": checksum mismatch, expected fnv1a64 ",
           l.hash, ", found ", found, " (the file changed after the save)");
}

bool Manifest::lists(const std::string& name) const { return find(name) != nullptr; }

const ManifestEntry* Manifest::find(const std::string& name) const {
  for (const ManifestEntry& e : files) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

void write_manifest(const fs::path& dir, int64_t step, int world,
                    const std::vector<std::string>& files) {
  nlohmann::json listed = nlohmann::json::array();
  for (const std::string& f : files) {
    const fs::path p = dir / f;
    TS_CHECK(fs::exists(p), "[checkpoint] expected ", p.string(), " after every rank wrote ",
             "its part, found no file");
    listed.push_back({{"name", f},
                      {"bytes", static_cast<int64_t>(fs::file_size(p))},
                      {"fnv1a64", file_fnv1a64(p.string())}});
  }
  const nlohmann::json manifest = {{"format", kFormat},
                                   {"version", kVersion},
                                   {"step", step},
                                   {"world", world},
                                   {"files", listed}};
  write_file_atomically((dir / "manifest.json").string(), {manifest.dump(1) + "\n"});
}

Manifest read_manifest(const fs::path& d) {
  TS_CHECK(fs::is_directory(d), "[checkpoint] expected a checkpoint directory, found no directory ",
           d.string());
  Manifest out;
  out.path = d / "manifest.json";
  TS_CHECK(fs::exists(out.path), "[checkpoint] ", d.string(),
           " has no manifest.json: the save did not complete; expected a committed checkpoint");
  const nlohmann::json manifest = parse_json_file(out.path.string());
  JsonObjectReader m(manifest, "checkpoint", "$");
  TS_CHECK(m.required<std::string>("format") == kFormat, "[checkpoint] ", out.path.string(),
           ": expected format \"", kFormat, "\"");
  const int64_t version = m.required<int64_t>("version");
  TS_CHECK(version == kVersion, "[checkpoint] ", out.path.string(), ": expected version ", kVersion,
           ", found ", version);
  m.required<int64_t>("step");
  out.world = m.get_in_range<int64_t>("world", 1, 1, 1 << 20);
  for (JsonObjectReader f : m.objects("files")) {
    ManifestEntry e;
    e.name = f.required<std::string>("name");
    e.bytes = f.required<int64_t>("bytes");
    e.hash = f.required<std::string>("fnv1a64");
    out.files.push_back(e);
  }
  m.finish();
  check_listed_files(d, out.path, out.files);
  return out;
}

std::string file_fnv1a64(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TS_CHECK(in, "[checkpoint] cannot read ", path);
  uint64_t h = 0xcbf29ce484222325ull;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = in.gcount();
    for (std::streamsize i = 0; i < n; ++i) {
      h = (h ^ static_cast<unsigned char>(buf[i])) * 0x100000001b3ull;
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

}  // namespace tessera::train
