// Storage: a reference-counted block of device memory shared by tensor views.
//
// Copies of a Storage handle share one memory block: every tensor viewing it sees the same
// bytes, and release()/reallocate() change the block for all of them at once. ZeRO stage 3
// uses that to free a partitioned parameter's gathered values while autograd nodes still
// hold views of it, and to gather them again before backward (PyTorch's
// `storage().resize_(0)` as FSDP uses it).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "core/allocator.h"
#include "core/device.h"

namespace tessera {

class Storage {
 public:
  Storage() = default;
  // Allocates `nbytes` on `device` through allocator_for(device).
  static Storage allocate(size_t nbytes, Device device);
  // Wraps memory owned elsewhere. `deleter` (may be empty) runs when the last view dies.
  static Storage from_blob(void* data, size_t nbytes, Device device,
                           std::function<void(void*)> deleter);

  void* data() const { return block_ ? block_->data : nullptr; }
  size_t nbytes() const { return block_ ? block_->nbytes : 0; }
  Device device() const { return block_ ? block_->device : Device(); }
  bool defined() const { return block_ != nullptr; }
  // Number of Storage handles sharing this memory.
  long use_count() const { return block_.use_count(); }

  // Frees the memory; every handle then has nbytes() == 0 (the device stays). Reading a
  // tensor over a released storage is an error (Tensor::raw_data).
  void release() const;
  // Replaces the memory with `nbytes` fresh, uninitialized bytes from
  // allocator_for(device()), or from `allocator` (memory of device()), for every handle.
  void reallocate(size_t nbytes) const;
  void reallocate(size_t nbytes, Allocator& allocator) const;
  // Moves the memory into a new Storage that owns it from now on, and leaves every handle
  // of this one released, as after release(): a write to disk that must outlive the
  // storage's bytes (TensorSwapper::swap_out).
  Storage take_memory() const;

 private:
  struct Block {
    void* data = nullptr;
    size_t nbytes = 0;
    Device device;
    std::function<void(void*)> free;  // null: not ours to free
    Block() = default;
    Block(const Block&) = delete;
    Block& operator=(const Block&) = delete;
    ~Block() { reset(); }
    void reset();
  };
  std::shared_ptr<Block> block_;
};

}  // namespace tessera
