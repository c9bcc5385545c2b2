// Safetensors files: reading with strict validation, and atomic writing.
//
// Layout: 8 bytes little-endian u64 N, then N bytes of a UTF-8 JSON object (may end in
// spaces), then the data section. Each JSON key other than "__metadata__" names a tensor:
//   {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
// with offsets relative to the data section. "__metadata__" is a string -> string map.
//
// Note [Safetensors validation]
// Reading is as strict as the reference implementation (huggingface/safetensors) and a
// little stricter: N <= 100 MB and N <= file size - 8; the header is a JSON object with no
// duplicate keys (at any depth, and at most kMaxJsonDepth deep: core/json.h), starting
// with '{' after any JSON whitespace (which the reference accepts); tensor names are
// non-empty and hold no NUL byte; every entry has exactly dtype, shape (at most
// kMaxSafetensorsDims dimensions) and data_offsets; the dtype is one Tessera holds;
// end - begin == numel * itemsize; sorted
// by offset, the tensors tile the data section from byte 0 with no gap and no overlap, and
// the last one ends exactly at the end of the file (no trailing bytes). BOOL bytes must be 0
// or 1. Every error is one line naming the file, the tensor and what was expected and found.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>

#include "autograd/module.h"
#include "autograd/streamed_state.h"

namespace tessera {

// The most dimensions a tensor of a file may have (NumPy 2's limit).
inline constexpr size_t kMaxSafetensorsDims = 64;

struct SafetensorsFile {
  StateDict tensors;                            // CPU, contiguous, in data-offset order
  std::map<std::string, std::string> metadata;  // "__metadata__" (empty when absent)
};

// Note [Mapped tensors]
// read_safetensors() maps the file into memory, copy-on-write, and its tensors are views of
// the mapping: nothing is read until a tensor's values are, and the pages read are the
// kernel's page cache, which it may drop under memory pressure and read again, so a file
// larger than memory (a checkpoint of NVMe-offloaded state) can be read a part at a time.
// Writing to a tensor changes a private copy of the page, never the file. A tensor whose
// data is not aligned to its element size in the file (files from other writers) is read
// into memory of its own instead, as is every tensor of a file that cannot be mapped. The
// mapping lives as long as the last view; the file must not be truncated meanwhile (files
// replaced by an atomic rename, as Tessera's writers do, are safe).

// Reads and validates the whole file (Note [Safetensors validation], Note [Mapped
// tensors]). Supported dtypes: F32, F16, BF16, F64, I32, I64, U8, BOOL; any other dtype is
// an error naming it.
SafetensorsFile read_safetensors(const std::string& path);

// Writes `tensors` (any device and layout; copied to contiguous CPU) in the given order,
// with `metadata` as "__metadata__" (omitted when empty). The header is padded with spaces
// so the data section starts at a multiple of 8. Rejects duplicate and empty names, names
// with a NUL byte, undefined tensors, the reserved name "__metadata__" and tensors of more
// than kMaxSafetensorsDims dimensions. Atomic: see core/file_io.h.
void write_safetensors(const std::string& path, const StateDict& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// The same for tensors produced piece by piece as they are written (autograd/
// streamed_state.h), so that no more than one piece need be in memory; pieces that do not
// add up to their tensor's bytes, or are not contiguous CPU tensors of its dtype, fail the
// write and leave `path` as it was.
void write_streamed_safetensors(const std::string& path, const StreamedStateDict& tensors,
                                const std::map<std::string, std::string>& metadata = {});

}  // namespace tessera
