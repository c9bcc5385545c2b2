// TensorSwapper: host storages whose bytes live in a swap file between uses, the NVMe
// side of ZeRO-Infinity (DeepSpeed's swap_tensor/, partitioned_optimizer_swapper.py and
// partitioned_param_swapper.py).
//
// Note [Swapped storages]
// Each storage added gets a region of one swap file (core/direct_file.h), at an offset and
// of a length rounded up to kDirectIoAlignment. Every transfer is staged through a pool of
// `buffer_count` aligned buffers of `buffer_size` bytes (DeepSpeed's buffer_count and
// buffer_size), so the storages need no alignment of their own, a tail shorter than a
// page is written padded, and what the swapper itself holds is bounded by the pool.
// swap_out() copies a storage's bytes into free buffers, starts their writes and releases
// the storage (Storage::release: its storage().nbytes() is 0 for every tensor viewing it,
// and reading it is an error); it returns with
// the last writes in flight, so the caller computes while they travel, and a buffer is
// reused only after its write completed. swap_in() reallocates the storages (from
// mapped_host_allocator(), so that their memory leaves the process when they are swapped
// out again, where the CPU allocator would keep it cached) and fills
// them: a region's reads start after every write in flight has completed (a region may
// still be on its way out), each buffer's bytes are copied out once its read completed,
// and it returns when all are filled. discard() drops a storage's bytes wherever they are
// (a gradient once the step has read it): its memory is released, its region kept, and
// the next swap_in() gives it zeros without reading (fresh mappings are zeros); a write to
// its region still in flight is waited for first, so that no two writes to one region are
// ever in flight together. A failed read or write is reported by the next
// call that waits, and every call after it reports it again: the swapper is then unusable, the
// storages it was filling released, and the bytes of those in the file lost, as the swap
// file survives nothing; the durable state is the checkpoint (Note [Atomic checkpoints] in
// tools/trainer/checkpoint.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/direct_file.h"
#include "core/storage.h"
#include "core/tensor.h"

namespace tessera::parallel {

class TensorSwapper {
 public:
  // Creates the swap file `path`; the pool holds `buffer_count` (>= 1) buffers of
  // `buffer_size` bytes (>= 1, rounded up to kDirectIoAlignment).
  TensorSwapper(std::string path, const AioConfig& aio, int buffer_count, int64_t buffer_size);
  // Waits for the writes in flight, whose buffers the pool holds.
  ~TensorSwapper();
  TensorSwapper(const TensorSwapper&) = delete;
  TensorSwapper& operator=(const TensorSwapper&) = delete;

  // Gives `storage` (host memory, allocated) a region of the swap file; returns its id.
  // The storage's size is fixed from now on.
  int64_t add(const Storage& storage);
  // A (numel) f32 host tensor whose storage is added and discarded: no memory until its
  // first swap_in(), which gives zeros. Sets `id` to the storage's id.
  Tensor add_zeros(int64_t numel, int64_t& id);
  // Writes the storages' bytes to their regions and releases them (Note [Swapped
  // storages]). Each must be allocated.
  void swap_out(const std::vector<int64_t>& ids);
  // Reallocates the storages and fills them from their regions, or with zeros where they
  // were discarded. Each must be released: swapped out or discarded.
  void swap_in(const std::vector<int64_t>& ids);
  // Releases the storages and forgets their bytes, in memory or in the file; the next
  // swap_in() fills them with zeros. Their regions stay theirs.
  void discard(const std::vector<int64_t>& ids);
  // Waits for the writes in flight; throws the failure, if one happened.
  void wait();
  // Forgets storages `ids` (their bytes, in memory or in the file, are no longer wanted):
  // the swapper drops its handles, and their regions stay unused.
  void drop(const std::vector<int64_t>& ids);

  // Whether storage `id` is in memory (false: its bytes are in the file, or discarded).
  bool resident(int64_t id) const { return entries_[static_cast<size_t>(id)].resident; }
  // Bytes of the storages that are in the file only (swapped out, not discarded or dropped).
  int64_t swapped_bytes() const;
  // Bytes of storage `id`, in memory or not.
  int64_t bytes(int64_t id) const { return entries_[static_cast<size_t>(id)].bytes; }
  // Bytes of the swap file's regions, and of the buffer pool.
  int64_t file_bytes() const { return file_bytes_; }
  int64_t pool_bytes() const;
  const std::string& path() const { return file_.path(); }

 private:
  struct Entry {
    Storage storage;
    int64_t bytes = 0;   // the storage's
    int64_t offset = 0;  // of its region
    bool resident = true;
    bool written = false;  // its region holds its bytes
    bool writing = false;  // a write to its region may be in flight
    bool dropped = false;
  };
  // A read into a buffer, to be copied into `target` once complete.
  struct PendingCopy {
    int buffer = 0;
    char* target = nullptr;
    int64_t bytes = 0;
  };
  // A free buffer, waiting for the file (and finishing pending copies) when none is.
  int take_buffer(std::vector<PendingCopy>& copies);
  // Waits for the file, copies completed reads out, and frees every buffer. On a failure
  // the swapper is unusable from then on (failure_), its buffers kept.
  void settle(std::vector<PendingCopy>& copies);
  // Throws the failure that made the swapper unusable, if any.
  void check_usable() const;
  Entry& entry(int64_t id);

  DirectFile file_;
  std::vector<AlignedBuffer> pool_;
  std::vector<int> free_;  // buffer indices
  std::vector<Entry> entries_;
  std::vector<int64_t> writing_;  // the entries whose `writing` is set
  int64_t file_bytes_ = 0;
  std::string failure_;  // why the swapper is unusable; empty while it is not
};

}  // namespace tessera::parallel
