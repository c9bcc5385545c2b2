#include "tools/trainer/tensorboard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace tessera::train {
namespace {

// The byte-at-a-time table of the reflected Castagnoli polynomial.
constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t n = 0; n < 256; ++n) {
    uint32_t c = n;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[n] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// Protobuf's wire format: a field's key is (number << 3) | wire type.
enum WireType : uint8_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, int field, WireType type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | type);
}

template <class T>
void put_little_endian(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // x86-64 and aarch64 Linux are little-endian
  out.append(bytes, sizeof(T));
}

void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Event fields 1 and 2 (Note [TensorBoard event files]); zero values are omitted.
std::string event_header(double wall_time, int64_t step) {
  std::string e;
  if (wall_time != 0) {
    put_key(e, 1, kFixed64);
    put_little_endian(e, wall_time);
  }
  if (step != 0) {
    put_key(e, 2, kVarint);
    put_varint(e, static_cast<uint64_t>(step));  // a negative int64 takes ten bytes
  }
  return e;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const char c : data) crc = kCrc32cTable[(crc ^ static_cast<uint8_t>(c)) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

std::string tfrecord(std::string_view data) {
  std::string length;
  put_little_endian(length, static_cast<uint64_t>(data.size()));
  std::string record = length;
  put_little_endian(record, masked_crc32c(length));
  record.append(data);
  put_little_endian(record, masked_crc32c(data));
  return record;
}

std::string file_version_event(double wall_time) {
  std::string e = event_header(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string scalar_event(const std::string& tag, float value, int64_t step, double wall_time) {
  std::string v;  // Summary.Value
  put_bytes(v, 1, tag);
  put_key(v, 2, kFixed32);
  put_little_endian(v, value);
  std::string summary;
  put_bytes(summary, 1, v);
  std::string e = event_header(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

std::string session_start_event(int64_t step, double wall_time) {
  std::string log;  // SessionLog
  put_key(log, 1, kVarint);
  put_varint(log, 1);  // START
  std::string e = event_header(wall_time, step);
  put_bytes(e, 7, log);
  return e;
}

double unix_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, double wall_time) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  TS_CHECK(!ec, "[tensorboard] cannot create the folder ", dir, ": ", ec.message());
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%010lld", static_cast<long long>(wall_time));
  const std::string stem = (fs::path(dir) / "events.out.tfevents.").string() + seconds + "." +
                           host_name() + "." + std::to_string(getpid()) + ".";
  // The lowest free <n>: made with O_EXCL, so two writers never share a file.
  for (int n = 0;; ++n) {
    path_ = stem + std::to_string(n);
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) {
      ::close(fd);
      break;
    }
    TS_CHECK(errno == EEXIST, "[tensorboard] cannot create ", path_, ": ", std::strerror(errno));
  }
  out_.open(path_, std::ios::binary | std::ios::trunc);
  TS_CHECK(out_.good(), "[tensorboard] cannot open ", path_, " for writing");
  out_ << tfrecord(file_version_event(wall_time));
  flush();
}

void TensorBoardWriter::add_scalar(const std::string& tag, float value, int64_t step,
                                   double wall_time) {
  out_ << tfrecord(scalar_event(tag, value, step, wall_time));
}

void TensorBoardWriter::add_session_start(int64_t step, double wall_time) {
  out_ << tfrecord(session_start_event(step, wall_time));
}

void TensorBoardWriter::flush() {
  out_.flush();
  TS_CHECK(out_.good(), "[tensorboard] writing ", path_, " failed (disk full?)");
}

}  // namespace tessera::train
