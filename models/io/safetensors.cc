#include "models/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/factories.h"
#include "core/file_io.h"
#include "core/json.h"

namespace tessera {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; Tessera reads it in place");

// The reference implementation's bound on the header, against header bombs.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeName {
  const char* name;
  DType dtype;
};
constexpr DTypeName kDTypes[] = {
    {"F32", DType::f32}, {"F16", DType::f16}, {"BF16", DType::bf16}, {"F64", DType::f64},
    {"I32", DType::i32}, {"I64", DType::i64}, {"U8", DType::u8},     {"BOOL", DType::boolean},
};

const char* safetensors_name(DType dtype) {
  for (const DTypeName& d : kDTypes) {
    if (d.dtype == dtype) return d.name;
  }
  TS_INTERNAL_ASSERT(false, "dtype ", dtype_name(dtype), " has no safetensors name");
}

std::string errno_str() { return std::strerror(errno); }

// Reads exactly `n` bytes at `offset`; a short read means the file shrank under us.
void read_exact(int fd, uint64_t offset, void* dst, uint64_t n, const std::string& where,
                const std::string& what) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, uint64_t{1} << 30));
    const ssize_t got = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    TS_CHECK(got >= 0, where, "reading ", what, " failed: ", errno_str());
    TS_CHECK(got > 0, where, "file is truncated: ", what, " ends past the end of the file");
    p += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
}

// The file's pages mapped copy-on-write (the tensors read are views of them: Note
// [Mapped tensors] in safetensors.h), unmapped when the last view is gone; null where the
// file cannot be mapped, whose tensors are then read into memory.
std::shared_ptr<void> map_file(int fd, uint64_t bytes) {
  void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) return nullptr;
  return std::shared_ptr<void>(p, [bytes](void* q) { ::munmap(q, static_cast<size_t>(bytes)); });
}

// One tensor entry of the header.
struct Entry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t nbytes = 0;  // numel * itemsize
};

std::string offsets_str(const Entry& e) { return str_cat("[", e.begin, ", ", e.end, "]"); }

// "tensor \"name\"" for messages, a long name cut to its first 100 bytes.
std::string tensor_label(const std::string& name) {
  constexpr size_t kShown = 100;
  if (name.size() <= kShown) return str_cat("tensor \"", name, "\"");
  return str_cat("tensor \"", name.substr(0, kShown), "...\" (a name of ", name.size(), " bytes)");
}

// A non-negative JSON integer, or an error naming `what`.
uint64_t as_offset(const nlohmann::json& v, const std::string& where, const std::string& what) {
  TS_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0), where, what,
           ": expected a non-negative integer, found ", describe_json(v));
  return v.get<uint64_t>();
}

// A tensor name that both reader and writer accept: non-empty, no NUL byte.
void check_name(const std::string& name, const std::string& where) {
  TS_CHECK(!name.empty(), where, "tensor names must be non-empty");
  const size_t nul = name.find('\0');
  TS_CHECK(nul == std::string::npos, where, "tensor name ",
           nlohmann::json(name.substr(0, 100))
               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
           name.size() > 100 ? "..." : "", " holds a NUL byte at ", nul,
           "; expected names without one");
}

Entry parse_entry(const std::string& name, const nlohmann::json& info, const std::string& where) {
  check_name(name, where);
  const std::string tensor = tensor_label(name);
  TS_CHECK(info.is_object(), where, tensor, ": expected an object with dtype, shape and ",
           "data_offsets, found ", describe_json(info));
  for (const auto& [key, value] : info.items()) {
    TS_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", where, tensor,
             ": unknown key \"", key, "\" (expected dtype, shape, data_offsets)");
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    TS_CHECK(info.contains(key), where, tensor, ": missing \"", key, "\"");
  }
  Entry e;
  e.name = name;

  const nlohmann::json& dtype = info.at("dtype");
  TS_CHECK(dtype.is_string(), where, tensor, ": dtype: expected a string, found ",
           describe_json(dtype));
  const std::string dtype_str = dtype.get<std::string>();
  const auto it = std::find_if(std::begin(kDTypes), std::end(kDTypes),
                               [&](const DTypeName& d) { return dtype_str == d.name; });
  TS_CHECK(it != std::end(kDTypes), where, tensor, ": unsupported dtype \"", dtype_str,
           "\" (expected one of F32, F16, BF16, F64, I32, I64, U8, BOOL)");
  e.dtype = it->dtype;

  const nlohmann::json& shape = info.at("shape");
  TS_CHECK(shape.is_array(), where, tensor, ": shape: expected an array, found ",
           describe_json(shape));
  TS_CHECK(shape.size() <= kMaxSafetensorsDims, where, tensor, ": shape: expected at most ",
           kMaxSafetensorsDims, " dimensions, found ", shape.size());
  uint64_t numel = 1;
  bool overflow = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    const uint64_t d = as_offset(shape[i], where, str_cat(tensor, ": shape[", i, "]"));
    TS_CHECK(d <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), where, tensor,
             ": shape[", i, "] = ", d, " exceeds the largest dimension (2^63 - 1)");
    e.shape.push_back(static_cast<int64_t>(d));
    overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
  }
  overflow = overflow || __builtin_mul_overflow(numel, uint64_t{itemsize(e.dtype)}, &e.nbytes);
  TS_CHECK(!overflow && e.nbytes <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
           where, tensor, ": shape ", shape_str(e.shape), " of ", dtype_str,
           " is too large (byte count overflows)");

  const nlohmann::json& offsets = info.at("data_offsets");
  TS_CHECK(offsets.is_array() && offsets.size() == 2, where, tensor,
           ": data_offsets: expected an array [begin, end], found ", describe_json(offsets),
           offsets.is_array() ? str_cat(" of ", offsets.size(), " elements") : "");
  e.begin = as_offset(offsets[0], where, str_cat(tensor, ": data_offsets[0]"));
  e.end = as_offset(offsets[1], where, str_cat(tensor, ": data_offsets[1]"));
  TS_CHECK(e.end >= e.begin, where, tensor, ": data_offsets ", offsets_str(e),
           ": expected end >= begin");
  return e;
}

std::map<std::string, std::string> parse_metadata(const nlohmann::json& meta,
                                                  const std::string& where) {
  TS_CHECK(meta.is_object(), where, "__metadata__: expected an object of strings, found ",
           describe_json(meta));
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : meta.items()) {
    TS_CHECK(value.is_string(), where, "__metadata__[\"", key, "\"]: expected a string, found ",
             describe_json(value));
    out.emplace(key, value.get<std::string>());
  }
  return out;
}

// Checks that the entries, sorted by offset, tile [0, data_bytes) exactly
// (Note [Safetensors validation]).
void check_layout(const std::vector<Entry>& sorted, uint64_t data_bytes, uint64_t file_bytes,
                  uint64_t header_end, const std::string& where) {
  uint64_t cursor = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : sorted) {
    const std::string tensor = tensor_label(e.name);
    TS_CHECK(e.begin <= cursor, where, tensor, ": data_offsets ", offsets_str(e),
             " leave a gap: expected begin ", cursor, ", found ", e.begin, " (", e.begin - cursor,
             " unused bytes after ",
             prev ? str_cat("tensor \"", prev->name, "\"") : "the start of the data section", ")");
    TS_CHECK(e.begin == cursor, where, tensor, ": data_offsets ", offsets_str(e),
             " overlap tensor \"", prev ? prev->name : "", "\": expected begin ", cursor,
             ", found ", e.begin);
    TS_CHECK(e.end - e.begin == e.nbytes, where, tensor, ": data_offsets ", offsets_str(e),
             " hold ", e.end - e.begin, " bytes, expected ", e.nbytes, " (",
             safetensors_name(e.dtype), " ", shape_str(e.shape), ")");
    cursor = e.end;
    prev = &e;
  }
  TS_CHECK(cursor <= data_bytes, where, "file is truncated: the tensors need ", cursor,
           " data bytes, found ", data_bytes, " (expected file size ", header_end + cursor,
           ", found ", file_bytes, ")");
  TS_CHECK(cursor == data_bytes, where, data_bytes - cursor,
           " trailing bytes after the last tensor: expected file size ", header_end + cursor,
           ", found ", file_bytes);
}

}  // namespace

SafetensorsFile read_safetensors(const std::string& path) {
  const std::string where = str_cat("[safetensors] ", path, ": ");
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  TS_CHECK(fd.get() >= 0, where, "cannot open: ", errno_str());
  struct stat st;
  TS_CHECK(::fstat(fd.get(), &st) == 0, where, "cannot stat: ", errno_str());
  TS_CHECK(S_ISREG(st.st_mode), where, "expected a regular file");
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);

  TS_CHECK(file_bytes >= 8, where, "file is truncated: expected at least 8 bytes (the header ",
           "length), found ", file_bytes);
  uint64_t header_bytes = 0;
  read_exact(fd.get(), 0, &header_bytes, 8, where, "the header length");
  TS_CHECK(header_bytes <= kMaxHeaderBytes, where, "header length ", header_bytes,
           " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  TS_CHECK(header_bytes <= file_bytes - 8, where, "file is truncated: header length ", header_bytes,
           " runs past the end of the file (expected at most ", file_bytes - 8, ", the file has ",
           file_bytes, " bytes)");

  std::string header(header_bytes, '\0');
  read_exact(fd.get(), 8, header.data(), header_bytes, where, "the header");
  // JSON whitespace may come first, as the reference reader accepts.
  const size_t start = header.find_first_not_of(" \t\r\n");
  TS_CHECK(start != std::string::npos && header[start] == '{', where,
           "header: expected a JSON object starting with '{', found ",
           start == std::string::npos
               ? (header.empty() ? std::string("an empty header") : std::string("only whitespace"))
               : str_cat("byte ", +static_cast<unsigned char>(header[start]), " at ", start));
  nlohmann::json doc;
  try {
    doc = parse_json(header, path);
  } catch (const Error& e) {
    TS_FAIL(where, "header is not valid JSON: ", e.what());
  }
  TS_CHECK(doc.is_object(), where, "header: expected a JSON object, found ", describe_json(doc));

  SafetensorsFile out;
  std::vector<Entry> entries;
  for (const auto& [key, value] : doc.items()) {
    if (key == "__metadata__") {
      out.metadata = parse_metadata(value, where);
    } else {
      entries.push_back(parse_entry(key, value, where));
    }
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  const uint64_t header_end = 8 + header_bytes;
  check_layout(entries, file_bytes - header_end, file_bytes, header_end, where);

  const std::shared_ptr<void> mapping = map_file(fd.get(), file_bytes);
  for (const Entry& e : entries) {
    const uint64_t at = header_end + e.begin;
    Tensor t;
    if (mapping && e.nbytes > 0 && at % itemsize(e.dtype) == 0) {
      t = from_blob(static_cast<char*>(mapping.get()) + at, e.shape, e.dtype, Device::cpu(),
                    [mapping](void*) {});
    } else {
      t = empty(e.shape, {e.dtype});
      read_exact(fd.get(), at, t.raw_data(), e.nbytes, where, tensor_label(e.name));
    }
    if (e.dtype == DType::boolean) {
      const uint8_t* b = static_cast<const uint8_t*>(t.raw_data());
      for (uint64_t i = 0; i < e.nbytes; ++i) {
        TS_CHECK(b[i] <= 1, where, tensor_label(e.name), ": BOOL element ", i,
                 ": expected byte 0 or 1, found ", +b[i]);
      }
    }
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

void write_safetensors(const std::string& path, const StateDict& tensors,
                       const std::map<std::string, std::string>& metadata) {
  for (const auto& [name, t] : tensors) {
    TS_CHECK(t.defined(), "[safetensors] ", path, ": tensor \"", name, "\" is undefined");
  }
  write_streamed_safetensors(path, streamed(tensors), metadata);
}

void write_streamed_safetensors(const std::string& path, const StreamedStateDict& tensors,
                                const std::map<std::string, std::string>& metadata) {
  const std::string where = str_cat("[safetensors] ", path, ": ");
  std::set<std::string> names;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const StreamedTensor& t : tensors) {
    const std::string& name = t.name;
    check_name(name, where);
    TS_CHECK(name != "__metadata__", where,
             "\"__metadata__\" is reserved and cannot name a tensor");
    TS_CHECK(names.insert(name).second, where, "duplicate tensor name \"", name, "\"");
    TS_CHECK(t.shape.size() <= kMaxSafetensorsDims, where, "tensor \"", name, "\" has ",
             t.shape.size(), " dimensions; expected at most ", kMaxSafetensorsDims);
    const uint64_t end = offset + static_cast<uint64_t>(numel_of(t.shape)) * itemsize(t.dtype);
    header[name] = {
        {"dtype", safetensors_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    TS_FAIL(where, "names and metadata must be valid UTF-8: ", e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_bytes = text.size();
  TS_CHECK(header_bytes <= kMaxHeaderBytes, where, "header of ", header_bytes,
           " bytes exceeds the limit of ", kMaxHeaderBytes, " bytes");

  const uint64_t file_bytes = 8 + header_bytes + offset;
  write_file_atomically(
      path,
      [&](const WriteBytes& write) {
        write(&header_bytes, 8);
        write(text.data(), text.size());
        for (const StreamedTensor& t : tensors) {
          produce_checked(
              t,
              [&](const Tensor& piece) {
                if (piece.nbytes() > 0) write(piece.raw_data(), piece.nbytes());
              },
              where);
        }
      },
      file_bytes);  // the disk space first: a checkpoint too big fails before it is written
}

}  // namespace tessera
