// Asynchronous direct I/O to one file, the disk layer under NVMe offload (ZeRO-Infinity):
// DeepSpeed's `aio` section and its async_io op (deepspeed/ops/csrc/aio), built on the
// kernel's native AIO (io_setup / io_submit / io_getevents, the interface libaio wraps)
// with no library in between.
//
// Note [Direct I/O]
// The file is opened with O_DIRECT, so reads and writes go between the caller's buffer
// and the device without the page cache: a swap file as large as the optimizer state does
// not crowd the memory it exists to save, and the disk's bandwidth is what is measured.
// The kernel then requires the buffer's address, the file offset and the length to be
// multiples of the logical block size; kDirectIoAlignment (4096) covers every common
// device, and AlignedBuffer provides such memory. A transfer is split into requests of at
// most block_size bytes. Each of intra_op_parallelism AIO contexts holds up to queue_depth
// requests in flight, and requests go to the contexts in turn. With single_submit each
// request is its own io_submit call, else a context's queued requests go in one call. With
// overlap_events, a full context reaps what has completed and goes on submitting; without,
// it waits until every request in flight has completed first. A request that transfers
// less than asked is continued with blocking I/O, which names the reason if there is one.
// A failed request (the disk full, an I/O error, a read past the end) is reported by the
// next wait() with the path, the operation, the offset and the system's reason; the
// file's other regions are unaffected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera {

// DeepSpeed's `aio` section (deepspeed/runtime/swap_tensor/aio_config.py), its defaults.
struct AioConfig {
  int64_t block_size = 1 << 20;  // bytes per request; a multiple of kDirectIoAlignment
  int queue_depth = 8;           // requests in flight per context
  int intra_op_parallelism = 1;  // AIO contexts
  bool single_submit = false;    // one request per io_submit
  bool overlap_events = true;    // reap completions while submitting
};

// Buffer addresses, file offsets and lengths of direct I/O are multiples of this.
constexpr int64_t kDirectIoAlignment = 4096;
// The largest request: one GiB (the kernel splits far smaller requests anyway).
constexpr int64_t kMaxBlockSize = int64_t{1} << 30;

// `bytes` rounded up to a multiple of kDirectIoAlignment.
int64_t round_up_to_direct_io(int64_t bytes);

// Throws unless `config` is usable: a block size that is a positive multiple of
// kDirectIoAlignment up to kMaxBlockSize, a queue depth of 1-1024 and 1-64 contexts.
// `context` starts the message ("[aio]").
void check_aio_config(const AioConfig& config, const std::string& context);

// Host memory aligned for direct I/O, zero-filled.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // `bytes` rounded up to kDirectIoAlignment.
  explicit AlignedBuffer(int64_t bytes);
  void* data() const { return data_.get(); }
  int64_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> data_;
  int64_t bytes_ = 0;
};

class DirectFile {
 public:
  // Creates `path`, which must not exist, for direct reads and writes. Throws when the file
  // cannot be created or the file system does not take O_DIRECT (removing what it made).
  // The file stays when the object goes; it may be unlinked at any time (the open file
  // lives on).
  DirectFile(std::string path, const AioConfig& config);
  // Waits for the requests in flight (their errors are dropped) and closes the file.
  ~DirectFile();
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;

  // Start writing or reading `bytes` at `offset` from or into `buffer`, which must stay
  // valid and untouched until wait() returns; all three aligned (Note [Direct I/O]). They
  // may block while the contexts are full.
  void start_write(int64_t offset, const void* buffer, int64_t bytes);
  void start_read(int64_t offset, void* buffer, int64_t bytes);
  // Waits for every started request; then throws the first failure since the last wait().
  void wait();
  // Requests started and not yet reaped.
  int64_t in_flight() const;

  // The path it was created at (for messages: the file may be unlinked since).
  const std::string& path() const { return path_; }

 private:
  struct Context;
  struct Request {
    bool write = false;
    int64_t offset = 0;
    int64_t bytes = 0;
    char* buffer = nullptr;
  };
  void start(bool write, int64_t offset, void* buffer, int64_t bytes);
  // Submits the context's queued requests.
  void submit(Context& c);
  // Reaps at least `min` completions of context c.
  void reap(Context& c, int64_t min);
  // A request that transferred `done` of its bytes (>= 0): the rest, with blocking I/O,
  // as a short write or read is not itself a failure; then its failure, if any.
  void finish_short(const Request& r, int64_t done);
  void record_failure(const Request& r, long result);

  std::string path_;
  AioConfig config_;
  int fd_ = -1;
  std::vector<std::unique_ptr<Context>> contexts_;
  size_t next_context_ = 0;
  std::string first_failure_;
};

}  // namespace tessera
