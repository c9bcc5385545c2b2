// TensorSwapper: host storages whose bytes live in a swap file between uses, the NVMe
// side of ZeRO-Infinity (DeepSpeed's swap_tensor/, partitioned_optimizer_swapper.py and
// partitioned_param_swapper.py).
//
// Note [Swapped storages]
// Each storage added gets a region of one swap file (core/direct_file.h), at an offset and
// of a length rounded up to kDirectIoAlignment, reserved on the disk as it is added (a disk
// too small fails add(), naming the path). The file's I/O thread carries the transfers
// (Note [The I/O thread] there), so they go on while the caller computes. swap_in() and
// prefetch() give a storage fresh memory from mapped_host_allocator(): page-aligned, whole
// pages, and gone from the process when released, where the CPU allocator would keep it
// cached. Its region is read straight into that memory, and swap_out() writes straight
// from it: it hands the memory to the write (Storage::take_memory), the storage is released
// at once for every tensor viewing it (its storage().nbytes() is 0, reading it is an error),
// and the memory goes when the write completes. A storage with memory of its own (one that
// was never swapped in) is staged through a pool of `buffer_count` aligned buffers of
// `buffer_size` bytes instead (DeepSpeed's buffer_count and buffer_size; each allocated at
// its first use), its tail padded.
// What the writes in flight hold is bounded: before a swap_out() starts, the earlier writes
// are waited for until their memory is at most the pool's bytes (the call's own storages
// come on top, and each is let go when its write completes). prefetch() starts the reads
// and returns; swap_in() waits for its storages' reads only, so other transfers (another
// sub-group's reads or writes) go on, and reads go to the disk before queued writes. A region's
// transfers never overlap: a read or write of a region waits for the region's previous transfer,
// and discard() waits for a read into the storage's memory. discard() drops a storage's bytes
// wherever they are (a gradient once the step has read it): its memory is released, its region
// kept, and the next swap_in() gives it zeros without reading (fresh mappings are zeros). A failed
// read or write is reported by the next call that waits, and every call after it reports it again:
// the swapper is then unusable, the storages it was filling released, and the bytes of those in the
// file lost, as the swap file survives nothing; the durable state is the checkpoint (Note [Atomic
// checkpoints] in tools/trainer/checkpoint.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/direct_file.h"
#include "core/storage.h"
#include "core/tensor.h"

namespace tessera::parallel {

class TensorSwapper {
 public:
  // Creates the swap file `path`; the pool holds `buffer_count` (>= 1) buffers of
  // `buffer_size` bytes (>= 1, rounded up to kDirectIoAlignment), each allocated at its
  // first use.
  TensorSwapper(std::string path, const AioConfig& aio, int buffer_count, int64_t buffer_size);
  // Waits for the writes in flight, whose buffers the pool holds.
  ~TensorSwapper();
  TensorSwapper(const TensorSwapper&) = delete;
  TensorSwapper& operator=(const TensorSwapper&) = delete;

  // Gives `storage` (host memory, allocated) a region of the swap file, reserved on the
  // disk; returns its id. The storage's size is fixed from now on.
  int64_t add(const Storage& storage);
  // A (numel) host tensor of `dtype` whose storage is added and discarded: no memory until its
  // first swap_in(), which gives zeros. Sets `id` to the storage's id.
  Tensor add_zeros(int64_t numel, int64_t& id, DType dtype = DType::f32);
  // Writes the storages' bytes to their regions and releases them (Note [Swapped
  // storages]); returns with the writes in flight. Each must be in memory.
  void swap_out(const std::vector<int64_t>& ids);
  // Starts bringing the storages in: reallocates them and starts their reads (those
  // discarded are zeros at once). Storages in memory or on their way are skipped.
  void prefetch(const std::vector<int64_t>& ids);
  // Brings the storages in (prefetch()) and waits for their reads. Each must be out of
  // memory: swapped out, discarded, or prefetched.
  void swap_in(const std::vector<int64_t>& ids);
  // Releases the storages and forgets their bytes, in memory or in the file; the next
  // swap_in() fills them with zeros. Their regions stay theirs.
  void discard(const std::vector<int64_t>& ids);
  // Releases storages that are in memory and unchanged since they were swapped in (the
  // caller's promise), without writing: their regions hold their bytes already.
  void evict(const std::vector<int64_t>& ids);
  // Calls use(i) for each of `ids` in turn with storage ids[i] in memory and unchanged by
  // `use` (a checkpoint reading swapped state): one that is out is read in (the next one's
  // read started first, so that it goes on during `use`) and let go after, unwritten; one
  // in memory, or an id of -1 (a storage not swapped), is used as it is.
  void read_each(const std::vector<int64_t>& ids, const std::function<void(size_t)>& use);
  // Waits for every transfer in flight; throws the failure, if one happened.
  void wait();
  // Waits for the writes of storages `ids` (and the transfers started before them).
  void wait_written(const std::vector<int64_t>& ids);
  // Forgets storages `ids` (their bytes, in memory or in the file, are no longer wanted):
  // the swapper drops its handles, and their regions stay unused.
  void drop(const std::vector<int64_t>& ids);

  // Whether storage `id` is in memory and readable (false: its bytes are in the file, on
  // their way in, or discarded).
  bool resident(int64_t id) const {
    return entries_[static_cast<size_t>(id)].state == State::resident;
  }
  // Bytes of the storages that are in the file only (swapped out, not discarded or dropped).
  int64_t swapped_bytes() const;
  // Bytes of storage `id`, in memory or not.
  int64_t bytes(int64_t id) const { return entries_[static_cast<size_t>(id)].bytes; }
  // Bytes of the swap file's regions, and of the buffer pool when all are allocated.
  int64_t file_bytes() const { return file_bytes_; }
  int64_t pool_bytes() const;
  const std::string& path() const { return file_.path(); }

 private:
  enum class State { resident, arriving, out };
  struct Entry {
    Storage storage;
    int64_t bytes = 0;   // the storage's
    int64_t offset = 0;  // of its region
    State state = State::resident;
    bool written = false;  // its region holds its bytes
    bool dropped = false;
    Transfer transfer;       // its region's last (DirectFile::done)
    void* mapped = nullptr;  // the memory swap_in() gave it, while the storage holds it
  };
  // Runs `wait`, one of the file's waits (which report its failures); on a failure the
  // swapper is unusable from then on (failure_).
  void checked(const std::function<void()>& wait);
  // Waits for transfer `t` (done or not, so that a failure is never missed).
  void wait_for(const Transfer& t);
  // Entry e's storage released (its bytes in the file, or gone), its memory with it.
  static void let_go(Entry& e);
  // The next pool buffer, once its last write has completed.
  int take_buffer();
  // Throws the failure that made the swapper unusable, if any.
  void check_usable() const;
  Entry& entry(int64_t id);

  DirectFile file_;
  std::vector<AlignedBuffer> pool_;  // empty buffers until first used
  int64_t buffer_bytes_ = 0;
  std::vector<Transfer> buffer_writes_;  // per buffer, its last write
  size_t next_buffer_ = 0;
  std::vector<Entry> entries_;
  int64_t file_bytes_ = 0;
  std::string failure_;  // why the swapper is unusable; empty while it is not
};

}  // namespace tessera::parallel
