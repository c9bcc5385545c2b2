#include "core/direct_file.h"

#include <fcntl.h>
#include <linux/aio_abi.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>
#include <utility>

#include "core/error.h"

namespace tessera {
namespace {

// The kernel's AIO calls (libaio's io_setup and friends are these system calls).
long aio_setup(unsigned n, aio_context_t* ctx) { return syscall(SYS_io_setup, n, ctx); }
long aio_destroy(aio_context_t ctx) { return syscall(SYS_io_destroy, ctx); }
long aio_submit(aio_context_t ctx, long n, iocb** cbs) {
  return syscall(SYS_io_submit, ctx, n, cbs);
}

std::string system_reason(int error) {
  return str_cat(std::strerror(error), " (errno ", error, ")");
}

// What a failed transfer reports when there is no memory to describe it.
constexpr std::string_view kFallbackFailure =
    "[aio] a transfer of the swap file failed, and there was no memory left to say which";

}  // namespace

int64_t round_up_to_direct_io(int64_t bytes) {
  return (bytes + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
}

void check_aio_config(const AioConfig& config, const std::string& context) {
  TS_CHECK(config.block_size > 0 && config.block_size % kDirectIoAlignment == 0 &&
               config.block_size <= kMaxBlockSize,
           context, " block_size: expected a positive multiple of ", kDirectIoAlignment,
           " bytes up to ", kMaxBlockSize, ", found ", config.block_size);
  TS_CHECK(config.queue_depth >= 1 && config.queue_depth <= 1024, context,
           " queue_depth: expected 1 to 1024, found ", config.queue_depth);
  TS_CHECK(config.intra_op_parallelism >= 1 && config.intra_op_parallelism <= 64, context,
           " intra_op_parallelism: expected 1 to 64, found ", config.intra_op_parallelism);
}

void AlignedBuffer::Free::operator()(void* p) const { std::free(p); }

AlignedBuffer::AlignedBuffer(int64_t bytes) : bytes_(round_up_to_direct_io(bytes)) {
  if (bytes_ == 0) return;
  void* p =
      std::aligned_alloc(static_cast<size_t>(kDirectIoAlignment), static_cast<size_t>(bytes_));
  TS_CHECK(p != nullptr, "[aio] could not allocate ", bytes_, " bytes of aligned host memory");
  std::memset(p, 0, static_cast<size_t>(bytes_));
  data_.reset(p);
}

// One AIO context: its request slots, those queued for submission, and those in flight.
// Only the I/O thread touches it, under mutex_.
struct DirectFile::Context {
  aio_context_t ctx = 0;
  std::vector<iocb> slots;        // (queue_depth)
  std::vector<Request> requests;  // (queue_depth): what each slot's request is
  std::vector<int> free;          // slot indices
  std::vector<iocb*> queued;      // filled, not yet submitted
  std::vector<io_event> events;   // (queue_depth)
  int64_t in_flight = 0;          // submitted, not yet reaped
  bool draining = false;          // without overlap_events: full, taking nothing until empty
};

DirectFile::DirectFile(std::string path, const AioConfig& config)
    : path_(std::move(path)), config_(config) {
  check_aio_config(config_, "[aio]");
  // O_EXCL: never someone else's file, so a failure below may remove what it created.
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  if (fd_ < 0) {
    const int error = errno;
    if (error != EEXIST) ::unlink(path_.c_str());  // O_DIRECT refused after the creation
    TS_CHECK(error != EINVAL, "[aio] ", path_,
             ": expected a file system that takes direct I/O (O_DIRECT), found one that "
             "does not (tmpfs before Linux 6.6, some overlay and network file systems)");
    TS_CHECK(false, "[aio] cannot create the swap file ", path_, ": ", system_reason(error));
  }
  try {
    event_fd_ = ::eventfd(0, EFD_CLOEXEC);
    TS_CHECK(event_fd_ >= 0, "[aio] eventfd failed: ", system_reason(errno));
    for (int i = 0; i < config_.intra_op_parallelism; ++i) {
      contexts_.push_back(std::make_unique<Context>());
      Context& c = *contexts_.back();
      if (aio_setup(static_cast<unsigned>(config_.queue_depth), &c.ctx) < 0) {
        const int error = errno;
        c.ctx = 0;
        TS_CHECK(false, "[aio] io_setup of ", config_.queue_depth,
                 " requests failed: ", system_reason(error),
                 "; expected fs.aio-max-nr to allow it");
      }
      c.slots.resize(static_cast<size_t>(config_.queue_depth));
      c.requests.resize(c.slots.size());
      c.events.resize(c.slots.size());
      c.queued.reserve(c.slots.size());
      for (int s = config_.queue_depth - 1; s >= 0; --s) c.free.push_back(s);
    }
    first_failure_.reserve(kFallbackFailure.size());
    thread_ = std::thread([this] { work(); });
  } catch (...) {
    for (const auto& c : contexts_) {
      if (c->ctx != 0) aio_destroy(c->ctx);
    }
    if (event_fd_ >= 0) ::close(event_fd_);
    ::close(fd_);
    ::unlink(path_.c_str());
    throw;
  }
}

DirectFile::~DirectFile() {
  try {
    wait();
  } catch (...) {  // the owner is going away: nobody is left to report to
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake();
  thread_.join();
  for (const auto& c : contexts_) aio_destroy(c->ctx);
  ::close(event_fd_);
  ::close(fd_);
}

Transfer DirectFile::start_write(int64_t offset, const void* buffer, int64_t bytes,
                                 std::shared_ptr<const void> keep) {
  return start(true, offset, const_cast<void*>(buffer), bytes, std::move(keep));
}

Transfer DirectFile::start_read(int64_t offset, void* buffer, int64_t bytes) {
  return start(false, offset, buffer, bytes, nullptr);
}

Transfer DirectFile::start(bool write, int64_t offset, void* buffer, int64_t bytes,
                           std::shared_ptr<const void> keep) {
  const auto address = reinterpret_cast<uintptr_t>(buffer);
  TS_CHECK(address % kDirectIoAlignment == 0 && offset % kDirectIoAlignment == 0 &&
               bytes % kDirectIoAlignment == 0 && offset >= 0 && bytes >= 0,
           "[aio] ", path_, ": expected the buffer address, offset and length of a direct ",
           write ? "write" : "read", " to be multiples of ", kDirectIoAlignment, ", found address ",
           address, ", offset ", offset, ", length ", bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  Transfer t{started_, started_};
  for (int64_t done = 0; done < bytes;) {
    const int64_t piece = std::min(config_.block_size, bytes - done);
    (write ? pending_writes_ : pending_reads_)
        .push_back({write, offset + done, piece, static_cast<char*>(buffer) + done, started_});
    outstanding_.insert(started_++);
    done += piece;
  }
  t.end = started_;
  if (keep && !done_locked(t)) {
    kept_.push_back({t, bytes, std::move(keep)});
    kept_bytes_ += bytes;
  }
  wake();
  return t;
}

void DirectFile::wake() const {
  const uint64_t one = 1;
  while (::write(event_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

void DirectFile::work() noexcept {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    for (const auto& c : contexts_) reap_ready(*c, lock);
    fill(lock);
    completed_.notify_all();
    if (stopping_ && outstanding_.empty()) return;
    lock.unlock();
    uint64_t events = 0;  // completions and wake-ups since the last read
    while (::read(event_fd_, &events, sizeof(events)) < 0 && errno == EINTR) {
    }
    lock.lock();
  }
}

void DirectFile::fill(std::unique_lock<std::mutex>& lock) {
  while (!pending_reads_.empty() || !pending_writes_.empty()) {
    Context* target = nullptr;
    for (size_t tried = 0; tried < contexts_.size() && target == nullptr; ++tried) {
      Context& c = *contexts_[next_context_++ % contexts_.size()];
      if (!c.free.empty() && !c.draining) target = &c;
    }
    if (target == nullptr) break;  // every context is full: completions will wake us
    Context& c = *target;
    const int slot = c.free.back();
    c.free.pop_back();
    std::deque<Request>& next = pending_reads_.empty() ? pending_writes_ : pending_reads_;
    const Request& r = c.requests[static_cast<size_t>(slot)] = next.front();
    next.pop_front();
    iocb& cb = c.slots[static_cast<size_t>(slot)];
    std::memset(&cb, 0, sizeof(cb));
    cb.aio_data = static_cast<uint64_t>(slot);
    cb.aio_lio_opcode = r.write ? IOCB_CMD_PWRITE : IOCB_CMD_PREAD;
    cb.aio_fildes = static_cast<uint32_t>(fd_);
    cb.aio_buf = reinterpret_cast<uint64_t>(r.buffer);
    cb.aio_nbytes = static_cast<uint64_t>(r.bytes);
    cb.aio_offset = r.offset;
    cb.aio_flags = IOCB_FLAG_RESFD;
    cb.aio_resfd = static_cast<uint32_t>(event_fd_);
    c.queued.push_back(&cb);
    if (c.free.empty() && !config_.overlap_events) c.draining = true;
  }
  for (const auto& c : contexts_) submit(*c, lock);
}

void DirectFile::submit(Context& c, std::unique_lock<std::mutex>& lock) {
  while (!c.queued.empty()) {
    const long n = config_.single_submit ? 1 : static_cast<long>(c.queued.size());
    // Only this thread touches the context: callers may start transfers meanwhile.
    lock.unlock();
    const long submitted = aio_submit(c.ctx, n, c.queued.data());
    const int error = submitted < 0 ? errno : EAGAIN;
    lock.lock();
    if (submitted > 0) {
      c.in_flight += submitted;
      c.queued.erase(c.queued.begin(), c.queued.begin() + submitted);
      continue;
    }
    if (error == EINTR) continue;
    if (error == EAGAIN && c.in_flight > 0) return;  // the kernel's queue is full: later
    // Refused outright: the queued requests fail with the reason (popped, so that the
    // vector keeps its reserved memory).
    while (!c.queued.empty()) {
      const iocb* cb = c.queued.back();
      c.queued.pop_back();
      complete(c, static_cast<int>(cb->aio_data), -error);
    }
    release_kept();
  }
}

void DirectFile::reap_ready(Context& c, std::unique_lock<std::mutex>& lock) {
  while (c.in_flight > 0) {
    timespec now{0, 0};
    lock.unlock();
    const long got =
        syscall(SYS_io_getevents, c.ctx, 0, static_cast<long>(c.in_flight), c.events.data(), &now);
    const long error = got < 0 ? -errno : 0;
    lock.lock();
    if (error == -EINTR) continue;
    if (got < 0) {
      // Only bad arguments fail here. Settle the context's requests (io_destroy cancels or
      // waits for them) so that nobody waits forever, and start it afresh.
      aio_destroy(c.ctx);
      c.ctx = 0;
      for (int slot = 0; slot < config_.queue_depth; ++slot) {
        if (std::find(c.free.begin(), c.free.end(), slot) == c.free.end() &&
            std::find(c.queued.begin(), c.queued.end(), &c.slots[static_cast<size_t>(slot)]) ==
                c.queued.end()) {
          complete(c, slot, error);
        }
      }
      c.in_flight = 0;
      c.draining = false;
      if (aio_setup(static_cast<unsigned>(config_.queue_depth), &c.ctx) < 0) c.ctx = 0;
      release_kept();
      return;
    }
    if (got == 0) return;
    c.in_flight -= got;
    for (long e = 0; e < got; ++e) {
      const io_event& event = c.events[static_cast<size_t>(e)];
      complete(c, static_cast<int>(event.data), static_cast<long>(event.res));
    }
    release_kept();
  }
}

void DirectFile::release_kept() {
  std::erase_if(kept_, [&](const Kept& k) {
    const bool done = done_locked(k.write);
    if (done) kept_bytes_ -= k.bytes;
    return done;
  });
}

void DirectFile::complete(Context& c, int slot, long result) {
  const Request& r = c.requests[static_cast<size_t>(slot)];
  if (result < 0) {
    record_failure(r, result);
  } else if (result < r.bytes) {
    finish_short(r, result);
  }
  outstanding_.erase(r.seq);
  c.free.push_back(slot);
  if (c.draining && c.in_flight == 0 && c.queued.empty()) c.draining = false;
}

void DirectFile::finish_short(const Request& r, int64_t done) {
  while (done < r.bytes) {
    const ssize_t n =
        r.write
            ? ::pwrite(fd_, r.buffer + done, static_cast<size_t>(r.bytes - done), r.offset + done)
            : ::pread(fd_, r.buffer + done, static_cast<size_t>(r.bytes - done), r.offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      record_failure(r, n < 0 ? -errno : done);
      return;
    }
    done += n;
  }
}

void DirectFile::record_failure(const Request& r, long result) {
  if (!first_failure_.empty()) return;
  try {
    const std::string what = str_cat("[aio] ", r.write ? "write" : "read", " of ", r.bytes,
                                     " bytes at offset ", r.offset, " of ", path_, ": ");
    // Copied in, not moved: first_failure_ keeps its reserved memory.
    first_failure_.assign(result < 0 ? what + system_reason(static_cast<int>(-result))
                                     : str_cat(what, "expected ", r.bytes, " bytes, transferred ",
                                               result, r.write ? "" : " (the file ends before)"));
  } catch (...) {  // no memory for the message: the reserved one says what it can
    first_failure_.assign(kFallbackFailure);
  }
}

bool DirectFile::done_locked(const Transfer& t) const {
  const auto first_open = outstanding_.lower_bound(t.first);
  return first_open == outstanding_.end() || *first_open >= t.end;
}

bool DirectFile::done(const Transfer& t) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_locked(t);
}

void DirectFile::throw_failure() {
  if (first_failure_.empty()) return;
  std::string what = std::exchange(first_failure_, std::string());
  // Memory for the I/O thread's next failure, reserved here on the caller's thread.
  first_failure_.reserve(kFallbackFailure.size());
  throw Error(std::move(what));
}

void DirectFile::wait_for(const Transfer& t) {
  std::unique_lock<std::mutex> lock(mutex_);
  completed_.wait(lock, [&] { return done_locked(t); });
  throw_failure();
}

void DirectFile::wait_kept_at_most(int64_t bytes) {
  std::unique_lock<std::mutex> lock(mutex_);
  completed_.wait(lock, [&] { return kept_bytes_ <= bytes; });
  throw_failure();
}

void DirectFile::wait() {
  Transfer all;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    all.end = started_;
  }
  wait_for(all);
}

void DirectFile::reserve(int64_t bytes) {
  int result = 0;
  do {
    result = ::fallocate(fd_, 0, 0, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
  } while (result == EINTR);
  TS_CHECK(result == 0 || result == EOPNOTSUPP, "[aio] cannot reserve ", bytes,
           " bytes for the swap file ", path_, ": ", system_reason(result));
}

int64_t DirectFile::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(outstanding_.size());
}

}  // namespace tessera
