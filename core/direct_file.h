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
// next wait() or wait_for() with the path, the operation, the offset and the system's
// reason; the file's other regions are unaffected.
//
// Note [The I/O thread]
// Each file has a thread of its own that submits the requests and reaps their completions
// (DeepSpeed's aio handle does its I/O on threads too), so start_write() and start_read()
// only queue a transfer and return: it goes on while the caller computes, however much
// larger than queue_depth x block_size it is (they may wait briefly while the thread does
// its bookkeeping, or completes a short transfer with blocking I/O). Completions signal an
// eventfd (IOCB_FLAG_RESFD) that the thread sleeps on, with the caller's wake-ups; the
// thread drops its lock around io_submit and io_getevents. Each transfer returns its
// requests' numbers (a Transfer), and done() and wait_for() answer for those alone, so a
// caller waits for what it needs (a sub-group's reads) while other transfers (the previous
// sub-group's writes) go on. A write may hand over the memory it writes from (`keep`),
// which the thread lets go when the write has completed, before a waiter can see it done.
// A failure is reported, once, by whichever wait comes first. Queued reads go to the kernel
// before queued writes, as callers wait for reads, so transfers complete in any order: a
// caller that writes a region and then reads it waits for the write before starting the
// read (TensorSwapper does).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
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

// The requests of one transfer, or of consecutive ones: numbers [first, end) in the order
// requests were started (Note [The I/O thread]).
struct Transfer {
  int64_t first = 0;
  int64_t end = 0;
};

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
  // Waits for the requests in flight (their errors are dropped), ends the I/O thread and
  // closes the file.
  ~DirectFile();
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;

  // Start writing or reading `bytes` at `offset` from or into `buffer`, all three aligned
  // (Note [Direct I/O]); `buffer` must stay valid and untouched until the transfer is done.
  // A write's `keep` (may be null) is held until then and let go (on the I/O thread).
  // Returns the transfer's requests (Note [The I/O thread]).
  Transfer start_write(int64_t offset, const void* buffer, int64_t bytes,
                       std::shared_ptr<const void> keep = nullptr);
  Transfer start_read(int64_t offset, void* buffer, int64_t bytes);
  // Whether every request of `t` has completed.
  bool done(const Transfer& t) const;
  // Waits until done(t); then throws the first failure since the last wait, if any (it
  // may be another transfer's).
  void wait_for(const Transfer& t);
  // Waits for every started transfer; then throws the first failure since the last wait.
  void wait();
  // Requests started and not yet completed.
  int64_t in_flight() const;
  // Waits until the memory handed over with writes still in flight (`keep`, counted as
  // the writes' bytes) is at most `bytes`; then throws as wait_for() does.
  void wait_kept_at_most(int64_t bytes);
  // Allocates the file's first `bytes` bytes on the disk (fallocate), so that a disk too
  // small fails here, naming the path and the reason, rather than at a write in flight.
  // A file system without fallocate is left to fail at the write.
  void reserve(int64_t bytes);

  // The path it was created at (for messages: the file may be unlinked since).
  const std::string& path() const { return path_; }

 private:
  struct Context;
  struct Request {
    bool write = false;
    int64_t offset = 0;
    int64_t bytes = 0;
    char* buffer = nullptr;
    int64_t seq = 0;  // requests are numbered in the order they were started
  };
  Transfer start(bool write, int64_t offset, void* buffer, int64_t bytes,
                 std::shared_ptr<const void> keep);
  // The I/O thread (Note [The I/O thread]) and its steps, each under mutex_. None of them
  // allocates (the vectors are reserved at construction, a failure's message falls back to
  // reserved memory), so the thread cannot throw, and a failure reaches a waiter instead.
  void work() noexcept;
  // Moves pending requests into free slots of the contexts that take them, and submits.
  void fill(std::unique_lock<std::mutex>& lock);
  // Submits the context's queued requests, as far as the kernel takes them now (unlocking
  // around the system call).
  void submit(Context& c, std::unique_lock<std::mutex>& lock);
  // Reaps the completions that are there, without waiting (likewise).
  void reap_ready(Context& c, std::unique_lock<std::mutex>& lock);
  // A request is over: its slot is free and its number no longer outstanding.
  void complete(Context& c, int slot, long result);
  // A request that transferred `done` of its bytes (>= 0): the rest, with blocking I/O,
  // as a short write or read is not itself a failure; then its failure, if any.
  void finish_short(const Request& r, int64_t done);
  void record_failure(const Request& r, long result);
  bool done_locked(const Transfer& t) const;
  // Lets go of the memory handed over with writes that have completed. Called before the
  // lock is released after completions, so that no waiter sees a write done while its
  // memory is still held (a caller's memory figures after a wait are settled).
  void release_kept();
  // Throws the first failure since the last wait, if any (under mutex_).
  void throw_failure();
  // Wakes the I/O thread.
  void wake() const;

  std::string path_;
  AioConfig config_;
  int fd_ = -1;
  int event_fd_ = -1;  // completions and wake-ups
  std::vector<std::unique_ptr<Context>> contexts_;
  size_t next_context_ = 0;
  mutable std::mutex mutex_;
  std::condition_variable completed_;  // a request completed
  // Started, not yet in a context: reads go first (a caller waits for them; writes can
  // wait).
  std::deque<Request> pending_reads_;
  std::deque<Request> pending_writes_;
  std::set<int64_t> outstanding_;  // numbers of the requests started, not completed
  // Memory handed over with writes (`keep`), until they complete, and its bytes.
  struct Kept {
    Transfer write;
    int64_t bytes = 0;
    std::shared_ptr<const void> memory;
  };
  std::vector<Kept> kept_;
  int64_t kept_bytes_ = 0;
  int64_t started_ = 0;  // requests started so far
  std::string first_failure_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tessera
