// A checkpoint's manifest.json, written last (Note [Atomic checkpoints] in
// tools/trainer/checkpoint.h): the files the checkpoint holds, each with its size and
// FNV-1a 64 hash, so that a load can check every file before reading any tensor.
//
//   {"format": "tessera-checkpoint", "version": 1, "step": 500, "world": 2,
//    "files": [{"name": "model.safetensors", "bytes": 3276800, "fnv1a64": "..."}, ...]}
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace tessera::train {

// A file as the manifest lists it.
struct ManifestEntry {
  std::string name;  // a plain file name inside the checkpoint directory
  int64_t bytes = 0;
  std::string hash;  // FNV-1a 64, 16 hex digits
};

struct Manifest {
  std::filesystem::path path;  // of manifest.json, for messages
  int64_t world = 1;           // ranks of the run that saved it
  std::vector<ManifestEntry> files;

  // Whether `name` is listed.
  bool lists(const std::string& name) const;
  // The entry of `name`, or null.
  const ManifestEntry* find(const std::string& name) const;
};

// Writes `dir`/manifest.json listing `files` (each must exist in `dir`) with their sizes and
// hashes, atomically and fsync'ed.
void write_manifest(const std::filesystem::path& dir, int64_t step, int world,
                    const std::vector<std::string>& files);

// Reads the manifest of checkpoint directory `dir` and checks it: format and version, and
// entries that each name one regular file inside `dir` (no path, no symbolic link) once,
// with `dir` holding exactly the listed files and the manifest: a manifest cannot make the
// loader read outside its checkpoint, and a stray file is not ignored. A missing manifest
// means an incomplete save.
Manifest read_manifest(const std::filesystem::path& dir);

// Checks the listed file `entry` of checkpoint `dir` against its size and hash.
void verify_file(const std::filesystem::path& dir, const ManifestEntry& entry);

// FNV-1a 64 of a file's bytes, as 16 hex digits.
std::string file_fnv1a64(const std::string& path);

}  // namespace tessera::train
