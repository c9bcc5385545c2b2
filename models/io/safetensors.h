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

namespace tessera {

// The most dimensions a tensor of a file may have (NumPy 2's limit).
inline constexpr size_t kMaxSafetensorsDims = 64;

struct SafetensorsFile {
  StateDict tensors;                            // CPU, contiguous, in data-offset order
  std::map<std::string, std::string> metadata;  // "__metadata__" (empty when absent)
};

// Reads and validates the whole file (Note [Safetensors validation]). Supported dtypes:
// F32, F16, BF16, F64, I32, I64, U8, BOOL; any other dtype is an error naming it.
SafetensorsFile read_safetensors(const std::string& path);

// Writes `tensors` (any device and layout; copied to contiguous CPU) in the given order,
// with `metadata` as "__metadata__" (omitted when empty). The header is padded with spaces
// so the data section starts at a multiple of 8. Rejects duplicate and empty names, names
// with a NUL byte, undefined tensors, the reserved name "__metadata__" and tensors of more
// than kMaxSafetensorsDims dimensions. Atomic: see core/file_io.h.
void write_safetensors(const std::string& path, const StateDict& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace tessera
