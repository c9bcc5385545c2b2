#include "core/direct_file.h"

#include <fcntl.h>
#include <linux/aio_abi.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
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
long aio_getevents(aio_context_t ctx, long min, long max, io_event* events) {
  return syscall(SYS_io_getevents, ctx, min, max, events, nullptr);
}

std::string system_reason(int error) {
  return str_cat(std::strerror(error), " (errno ", error, ")");
}

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
struct DirectFile::Context {
  aio_context_t ctx = 0;
  std::vector<iocb> slots;        // (queue_depth)
  std::vector<Request> requests;  // (queue_depth): what each slot's request is
  std::vector<int> free;          // slot indices
  std::vector<iocb*> queued;      // filled, not yet submitted
  std::vector<io_event> events;   // (queue_depth)
  int64_t in_flight = 0;          // submitted, not yet reaped
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
      for (int s = config_.queue_depth - 1; s >= 0; --s) c.free.push_back(s);
    }
  } catch (...) {
    for (const auto& c : contexts_) {
      if (c->ctx != 0) aio_destroy(c->ctx);
    }
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
  for (const auto& c : contexts_) aio_destroy(c->ctx);
  ::close(fd_);
}

void DirectFile::start_write(int64_t offset, const void* buffer, int64_t bytes) {
  start(true, offset, const_cast<void*>(buffer), bytes);
}

void DirectFile::start_read(int64_t offset, void* buffer, int64_t bytes) {
  start(false, offset, buffer, bytes);
}

void DirectFile::start(bool write, int64_t offset, void* buffer, int64_t bytes) {
  const auto address = reinterpret_cast<uintptr_t>(buffer);
  TS_CHECK(address % kDirectIoAlignment == 0 && offset % kDirectIoAlignment == 0 &&
               bytes % kDirectIoAlignment == 0 && offset >= 0 && bytes >= 0,
           "[aio] ", path_, ": expected the buffer address, offset and length of a direct ",
           write ? "write" : "read", " to be multiples of ", kDirectIoAlignment, ", found address ",
           address, ", offset ", offset, ", length ", bytes);
  for (int64_t done = 0; done < bytes;) {
    const int64_t piece = std::min(config_.block_size, bytes - done);
    Context& c = *contexts_[next_context_++ % contexts_.size()];
    if (c.free.empty()) {
      submit(c);
      reap(c, config_.overlap_events ? 1 : c.in_flight);
    }
    const int slot = c.free.back();
    c.free.pop_back();
    iocb& cb = c.slots[static_cast<size_t>(slot)];
    std::memset(&cb, 0, sizeof(cb));
    cb.aio_data = static_cast<uint64_t>(slot);
    cb.aio_lio_opcode = write ? IOCB_CMD_PWRITE : IOCB_CMD_PREAD;
    cb.aio_fildes = static_cast<uint32_t>(fd_);
    cb.aio_buf = static_cast<uint64_t>(address + static_cast<uintptr_t>(done));
    cb.aio_nbytes = static_cast<uint64_t>(piece);
    cb.aio_offset = offset + done;
    c.requests[static_cast<size_t>(slot)] = {write, offset + done, piece,
                                             static_cast<char*>(buffer) + done};
    c.queued.push_back(&cb);
    if (config_.single_submit) submit(c);
    done += piece;
  }
  for (const auto& c : contexts_) submit(*c);
}

void DirectFile::submit(Context& c) {
  while (!c.queued.empty()) {
    const long n = config_.single_submit ? 1 : static_cast<long>(c.queued.size());
    const long submitted = aio_submit(c.ctx, n, c.queued.data());
    if (submitted > 0) {
      c.in_flight += submitted;
      c.queued.erase(c.queued.begin(), c.queued.begin() + submitted);
      continue;
    }
    const int error = submitted < 0 ? errno : EAGAIN;
    if ((error == EAGAIN || error == EINTR) && c.in_flight > 0) {
      reap(c, 1);  // the kernel's queue is full: make room
      continue;
    }
    if (error == EINTR) continue;
    // Refused outright: the queued requests fail with the reason.
    for (iocb* cb : c.queued) {
      const int slot = static_cast<int>(cb->aio_data);
      record_failure(c.requests[static_cast<size_t>(slot)], -error);
      c.free.push_back(slot);
    }
    c.queued.clear();
  }
}

void DirectFile::reap(Context& c, int64_t min) {
  int64_t reaped = 0;
  while (c.in_flight > 0 && reaped < std::max<int64_t>(min, 1)) {
    const long got = aio_getevents(c.ctx, 1, static_cast<long>(c.in_flight), c.events.data());
    if (got < 0) {
      const int error = errno;
      TS_CHECK(error == EINTR, "[aio] ", path_, ": io_getevents failed: ", system_reason(error));
      continue;
    }
    for (long e = 0; e < got; ++e) {
      const int slot = static_cast<int>(c.events[static_cast<size_t>(e)].data);
      const Request& r = c.requests[static_cast<size_t>(slot)];
      const long result = static_cast<long>(c.events[static_cast<size_t>(e)].res);
      if (result < 0) {
        record_failure(r, result);
      } else if (result < r.bytes) {
        finish_short(r, result);
      }
      c.free.push_back(slot);
    }
    c.in_flight -= got;
    reaped += got;
  }
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
  const std::string what = str_cat("[aio] ", r.write ? "write" : "read", " of ", r.bytes,
                                   " bytes at offset ", r.offset, " of ", path_, ": ");
  first_failure_ = result < 0 ? what + system_reason(static_cast<int>(-result))
                              : str_cat(what, "expected ", r.bytes, " bytes, transferred ", result,
                                        r.write ? "" : " (the file ends before)");
}

void DirectFile::wait() {
  for (const auto& c : contexts_) {
    submit(*c);
    reap(*c, c->in_flight);
  }
  if (!first_failure_.empty()) throw Error(std::exchange(first_failure_, std::string()));
}

int64_t DirectFile::in_flight() const {
  int64_t n = 0;
  for (const auto& c : contexts_) n += c->in_flight + static_cast<int64_t>(c->queued.size());
  return n;
}

}  // namespace tessera
