#include "parallel/offload/tensor_swapper.h"

#include <algorithm>
#include <cstring>
#include <exception>
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
  pool_.resize(static_cast<size_t>(buffer_count));
  buffer_bytes_ = round_up_to_direct_io(buffer_size);
  buffer_writes_.assign(pool_.size(), Transfer{});
}

TensorSwapper::~TensorSwapper() {
  try {
    file_.wait();  // before the storages go: reads may still be filling them
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

void TensorSwapper::checked(const std::function<void()>& wait) {
  try {
    wait();
  } catch (const Error& e) {
    failure_ = e.what();
    throw;
  }
}

void TensorSwapper::wait_for(const Transfer& t) {
  checked([&] { file_.wait_for(t); });
}

void TensorSwapper::let_go(Entry& e) {
  e.storage.release();
  e.mapped = nullptr;
  e.state = State::out;
}

void TensorSwapper::drop(const std::vector<int64_t>& ids) {
  for (const int64_t id : ids) {
    Entry& e = entry(id);
    if (e.state == State::arriving) wait_for(e.transfer);  // the read writes into its memory
    e.storage = Storage();
    e.mapped = nullptr;
    e.dropped = true;
  }
}

void TensorSwapper::discard(const std::vector<int64_t>& ids) {
  check_usable();
  for (const int64_t id : ids) {
    Entry& e = entry(id);
    if (e.state == State::arriving) wait_for(e.transfer);
    let_go(e);
    e.written = false;
  }
}

void TensorSwapper::evict(const std::vector<int64_t>& ids) {
  check_usable();
  for (const int64_t id : ids) {
    Entry& e = entry(id);
    TS_CHECK(e.state == State::resident && e.written, "[swap] ", file_.path(), ": storage ", id,
             " is not a swapped-in copy of its region; expected it swapped in before evicting it");
    let_go(e);
  }
}

void TensorSwapper::read_each(const std::vector<int64_t>& ids,
                              const std::function<void(size_t)>& use) {
  std::vector<bool> bring(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) bring[i] = ids[i] >= 0 && !resident(ids[i]);
  const auto start = [&](size_t i) {
    if (i < ids.size() && bring[i]) prefetch({ids[i]});
  };
  // Let storage i go again: unwritten (its region holds its bytes), or as zeros.
  const auto let_go_of = [&](size_t i) {
    if (!resident(ids[i])) swap_in({ids[i]});  // a read still on its way
    if (entry(ids[i]).written) {
      evict({ids[i]});
    } else {
      discard({ids[i]});
    }
  };
  start(0);
  for (size_t i = 0; i < ids.size(); ++i) {
    start(i + 1);  // the next read goes on while this storage is used
    if (bring[i] && !resident(ids[i])) swap_in({ids[i]});  // a discarded one is zeros at once
    try {
      use(i);
    } catch (...) {
      // This storage and the next, on its way in, go out again, and `use`'s error is the
      // one reported (the swapper records its own failures for later calls).
      try {
        if (bring[i]) let_go_of(i);
        if (i + 1 < ids.size() && bring[i + 1]) let_go_of(i + 1);
      } catch (...) {
      }
      throw;
    }
    if (bring[i]) let_go_of(i);
  }
}

Tensor TensorSwapper::add_zeros(int64_t numel, int64_t& id, DType dtype) {
  // Memory of the swapper's own kind, not the CPU allocator's, which would keep it cached.
  const Tensor t = unmaterialized({numel}, {dtype, Device::cpu()});
  t.storage().reallocate(static_cast<size_t>(numel) * itemsize(dtype), mapped_host_allocator());
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
  file_.reserve(file_bytes_ + round_up_to_direct_io(e.bytes));  // a full disk fails here
  file_bytes_ += round_up_to_direct_io(e.bytes);
  entries_.push_back(std::move(e));
  return static_cast<int64_t>(entries_.size()) - 1;
}

int64_t TensorSwapper::swapped_bytes() const {
  int64_t bytes = 0;
  for (const Entry& e : entries_) {
    if (e.state != State::resident && e.written && !e.dropped) bytes += e.bytes;
  }
  return bytes;
}

int64_t TensorSwapper::pool_bytes() const {
  return buffer_bytes_ * static_cast<int64_t>(pool_.size());
}

int TensorSwapper::take_buffer() {
  // Buffers are taken in turn, so the next one's write is the oldest.
  const size_t b = next_buffer_++ % pool_.size();
  wait_for(buffer_writes_[b]);
  if (pool_[b].bytes() == 0) pool_[b] = AlignedBuffer(buffer_bytes_);
  return static_cast<int>(b);
}

void TensorSwapper::swap_out(const std::vector<int64_t>& ids) {
  check_usable();
  checked([&] { file_.wait_kept_at_most(pool_bytes()); });
  for (const int64_t id : ids) {
    Entry& e = entry(id);
    TS_CHECK(e.state == State::resident && static_cast<int64_t>(e.storage.nbytes()) == e.bytes,
             "[swap] ", file_.path(), ": storage ", id, " of ", e.bytes,
             " bytes is not resident (found ", e.storage.nbytes(),
             " bytes); expected it swapped in before swapping it out");
    wait_for(e.transfer);  // the region's last write, if still in flight
    const int64_t length = round_up_to_direct_io(e.bytes);
    if (e.mapped != nullptr && e.storage.data() == e.mapped) {  // whole pages of its own
      auto memory = std::make_shared<Storage>(e.storage.take_memory());
      e.transfer = file_.start_write(e.offset, memory->data(), length, memory);
    } else {
      const auto* source = static_cast<const char*>(e.storage.data());
      e.transfer = Transfer{};
      for (int64_t at = 0; at < e.bytes;) {
        const int b = take_buffer();
        AlignedBuffer& buffer = pool_[static_cast<size_t>(b)];
        const int64_t piece = std::min(buffer.bytes(), e.bytes - at);
        std::memcpy(buffer.data(), source + at, static_cast<size_t>(piece));
        const Transfer piece_write =
            file_.start_write(e.offset + at, buffer.data(), round_up_to_direct_io(piece));
        buffer_writes_[static_cast<size_t>(b)] = piece_write;
        // The pieces' requests are consecutive: the region's write spans them all.
        e.transfer = {at == 0 ? piece_write.first : e.transfer.first, piece_write.end};
        at += piece;
      }
    }
    let_go(e);
    e.written = true;
  }
}

void TensorSwapper::prefetch(const std::vector<int64_t>& ids) {
  check_usable();
  for (const int64_t id : ids) {
    Entry& e = entry(id);
    if (e.state != State::out) continue;
    wait_for(e.transfer);  // the region may still be on its way out
    e.storage.reallocate(static_cast<size_t>(e.bytes), mapped_host_allocator());
    e.mapped = e.storage.data();
    if (!e.written) {  // discarded: a fresh mapping's zeros, soon written by the caller
      populate_pages(e.mapped, static_cast<size_t>(e.bytes));
      e.state = State::resident;
      continue;
    }
    e.transfer = file_.start_read(e.offset, e.mapped, round_up_to_direct_io(e.bytes));
    e.state = State::arriving;
  }
}

void TensorSwapper::swap_in(const std::vector<int64_t>& ids) {
  for (const int64_t id : ids) {
    TS_CHECK(entry(id).state != State::resident, "[swap] ", file_.path(), ": storage ", id,
             " is resident; expected it swapped out or discarded before swapping it in");
  }
  prefetch(ids);
  std::exception_ptr failed;
  for (const int64_t id : ids) {  // every read, even after a failure: they fill the memory
    const Entry& e = entry(id);
    if (e.state != State::arriving) continue;
    try {
      wait_for(e.transfer);
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) {
    for (const int64_t id : ids) let_go(entry(id));  // not filled: nobody may read them
    std::rethrow_exception(failed);
  }
  for (const int64_t id : ids) entry(id).state = State::resident;
}

void TensorSwapper::wait_written(const std::vector<int64_t>& ids) {
  check_usable();
  for (const int64_t id : ids) {
    const Entry& e = entry(id);
    if (e.state == State::out && e.written) wait_for(e.transfer);
  }
}

void TensorSwapper::wait() {
  check_usable();
  checked([&] { file_.wait(); });
}

}  // namespace tessera::parallel
