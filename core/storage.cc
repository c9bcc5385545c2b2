#include "core/storage.h"

#include <utility>

#include "core/allocator.h"

namespace tessera {
namespace {

// A deleter that returns `nbytes` at p to `alloc`.
std::function<void(void*)> returning_to(Allocator& alloc, size_t nbytes) {
  return [&alloc, nbytes](void* p) { alloc.deallocate(p, nbytes); };
}

}  // namespace

void Storage::Block::reset() {
  if (free && data != nullptr) free(data);
  data = nullptr;
  nbytes = 0;
  free = nullptr;
}

Storage Storage::allocate(size_t nbytes, Device device) {
  Storage s;
  s.block_ = std::make_shared<Block>();
  s.block_->device = device;
  s.reallocate(nbytes);
  return s;
}

Storage Storage::from_blob(void* data, size_t nbytes, Device device,
                           std::function<void(void*)> deleter) {
  Storage s;
  s.block_ = std::make_shared<Block>();
  s.block_->data = data;
  s.block_->nbytes = nbytes;
  s.block_->device = device;
  s.block_->free = std::move(deleter);
  return s;
}

void Storage::release() const {
  if (block_) block_->reset();
}

Storage Storage::take_memory() const {
  if (!block_) return Storage();
  Storage taken = from_blob(block_->data, block_->nbytes, block_->device, std::move(block_->free));
  block_->data = nullptr;
  block_->nbytes = 0;
  block_->free = nullptr;
  return taken;
}

void Storage::reallocate(size_t nbytes) const {
  if (block_) reallocate(nbytes, allocator_for(block_->device));
}

void Storage::reallocate(size_t nbytes, Allocator& alloc) const {
  if (!block_) return;
  block_->reset();
  block_->data = alloc.allocate(nbytes);
  block_->nbytes = nbytes;
  block_->free = returning_to(alloc, nbytes);
}

}  // namespace tessera
