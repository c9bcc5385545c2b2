#include "parallel/offload/tensor_swapper.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/factories.h"

namespace tessera::parallel {

TensorSwapper::TensorSwapper(std::string path, const AioConfig& aio, int buffer_count,
                             int64_t buffer_size)
    : file_(std::move(path), aio) {
  TS_CHECK(buffer_count >= 1, "[swap] ", file_.path(), ": expected buffer_count >= 1, found ",
           buffer_count);
  TS_CHECK(buffer_size >= 1, "[swap] ", file_.path(), ": expected buffer_size >= 1, found ",
           buffer_size);
  for (int b = 0; b < buffer_count; ++b) {
    pool_.emplace_back(buffer_size);
    free_.push_back(buffer_count - 1 - b);
  }
}

TensorSwapper::~TensorSwapper() {
  try {
    file_.wait();
  } catch (...) {  // the owner is going away: nobody is left to report to
  }
}

void TensorSwapper::check_usable() const {
  if (!failure_.empty()) {
    throw Error(
        str_cat("[swap] ", file_.path(), " is unusable after an earlier failure: ", failure_));
  }
}

TensorSwapper::Entry& TensorSwapper::entry(int64_t id) {
  TS_CHECK(id >= 0 && id < static_cast<int64_t>(entries_.size()) &&
               !entries_[static_cast<size_t>(id)].dropped,
           "[swap] ", file_.path(), ": expected the id of a storage added and not dropped, found ",
           id);
  return entries_[static_cast<size_t>(id)];
}

void TensorSwapper::drop(const std::vector<int64_t>& ids) {
  for (const int64_t id : ids) {
    Entry& e = entry(id);
    e.storage = Storage();
    e.dropped = true;
  }
}

void TensorSwapper::discard(const std::vector<int64_t>& ids) {
  check_usable();
  bool writing = false;
  for (const int64_t id : ids) writing = writing || entry(id).writing;
  if (writing) {  // the region's next write must not race its last one
    std::vector<PendingCopy> none;
    settle(none);
  }
  for (const int64_t id : ids) {
    Entry& e = entry(id);
    e.storage.release();
    e.resident = false;
    e.written = false;
  }
}

Tensor TensorSwapper::add_zeros(int64_t numel, int64_t& id) {
  const Tensor t = empty({numel});
  id = add(t.storage());
  discard({id});
  return t;
}

int64_t TensorSwapper::add(const Storage& storage) {
  check_usable();
  TS_CHECK(storage.defined() && storage.device().type == DeviceType::cpu && storage.nbytes() > 0,
           "[swap] ", file_.path(), ": expected an allocated host storage to swap, found ",
           storage.defined() ? str_cat(storage.nbytes(), " bytes on ", storage.device().str())
                             : std::string("none"));
  Entry e;
  e.storage = storage;
  e.bytes = static_cast<int64_t>(storage.nbytes());
  e.offset = file_bytes_;
  file_bytes_ += round_up_to_direct_io(e.bytes);
  entries_.push_back(std::move(e));
  return static_cast<int64_t>(entries_.size()) - 1;
}

int64_t TensorSwapper::swapped_bytes() const {
  int64_t bytes = 0;
  for (const Entry& e : entries_) {
    if (!e.resident && e.written && !e.dropped) bytes += e.bytes;
  }
  return bytes;
}

int64_t TensorSwapper::pool_bytes() const {
  return pool_.empty() ? 0 : pool_.front().bytes() * static_cast<int64_t>(pool_.size());
}

void TensorSwapper::settle(std::vector<PendingCopy>& copies) {
  std::vector<PendingCopy> done = std::exchange(copies, {});
  try {
    file_.wait();
  } catch (const Error& e) {
    failure_ = e.what();  // requests may still be in flight: the buffers stay taken
    throw;
  }
  for (const PendingCopy& c : done) {
    std::memcpy(c.target, pool_[static_cast<size_t>(c.buffer)].data(),
                static_cast<size_t>(c.bytes));
  }
  free_.clear();
  for (int b = static_cast<int>(pool_.size()) - 1; b >= 0; --b) free_.push_back(b);
  for (const int64_t id : writing_) entries_[static_cast<size_t>(id)].writing = false;
  writing_.clear();
}

int TensorSwapper::take_buffer(std::vector<PendingCopy>& copies) {
  if (free_.empty()) settle(copies);
  const int b = free_.back();
  free_.pop_back();
  return b;
}

void TensorSwapper::swap_out(const std::vector<int64_t>& ids) {
  check_usable();
  std::vector<PendingCopy> none;
  for (const int64_t id : ids) {
    Entry& e = entry(id);
    TS_CHECK(e.resident && static_cast<int64_t>(e.storage.nbytes()) == e.bytes, "[swap] ",
             file_.path(), ": storage ", id, " of ", e.bytes, " bytes is not resident (found ",
             e.storage.nbytes(), " bytes); expected it swapped in before swapping it out");
    const auto* source = static_cast<const char*>(e.storage.data());
    for (int64_t at = 0; at < e.bytes;) {
      const int b = take_buffer(none);
      AlignedBuffer& buffer = pool_[static_cast<size_t>(b)];
      const int64_t piece = std::min(buffer.bytes(), e.bytes - at);
      std::memcpy(buffer.data(), source + at, static_cast<size_t>(piece));
      file_.start_write(e.offset + at, buffer.data(), round_up_to_direct_io(piece));
      at += piece;
    }
    e.storage.release();
    e.resident = false;
    e.written = true;
    if (!e.writing) writing_.push_back(id);
    e.writing = true;
  }
}

void TensorSwapper::swap_in(const std::vector<int64_t>& ids) {
  check_usable();
  bool reads = false;
  for (const int64_t id : ids) {
    const Entry& e = entry(id);
    reads = reads || e.written;
    TS_CHECK(!e.resident, "[swap] ", file_.path(), ": storage ", id,
             " is resident; expected it swapped out or discarded before swapping it in");
  }
  std::vector<PendingCopy> copies;
  std::vector<Entry*> filling;
  try {
    if (reads && file_.in_flight() > 0) settle(copies);  // a region may still be on its way out
    for (const int64_t id : ids) {
      Entry& e = entry(id);
      e.storage.reallocate(static_cast<size_t>(e.bytes), mapped_host_allocator());
      filling.push_back(&e);
      auto* target = static_cast<char*>(e.storage.data());
      if (!e.written) continue;  // discarded: a fresh mapping's zeros
      for (int64_t at = 0; at < e.bytes;) {
        const int b = take_buffer(copies);
        AlignedBuffer& buffer = pool_[static_cast<size_t>(b)];
        const int64_t piece = std::min(buffer.bytes(), e.bytes - at);
        file_.start_read(e.offset + at, buffer.data(), round_up_to_direct_io(piece));
        copies.push_back({b, target + at, piece});
        at += piece;
      }
    }
    if (reads) settle(copies);
  } catch (...) {
    for (Entry* e : filling) e->storage.release();  // not filled: nobody may read them
    throw;
  }
  for (Entry* e : filling) e->resident = true;
}

void TensorSwapper::wait() {
  check_usable();
  std::vector<PendingCopy> none;
  settle(none);
}

}  // namespace tessera::parallel
