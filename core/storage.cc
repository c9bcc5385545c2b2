#include "core/storage.h"

#include "core/allocator.h"

namespace tessera {

Storage Storage::allocate(size_t nbytes, Device device) {
  Allocator& alloc = allocator_for(device);
  Storage s;
  s.data_ = std::shared_ptr<void>(alloc.allocate(nbytes),
                                  [&alloc, nbytes](void* p) { alloc.deallocate(p, nbytes); });
  s.nbytes_ = nbytes;
  s.device_ = device;
  s.defined_ = true;
  return s;
}

Storage Storage::from_blob(void* data, size_t nbytes, Device device,
                           std::function<void(void*)> deleter) {
  Storage s;
  if (deleter) {
    s.data_ = std::shared_ptr<void>(data, std::move(deleter));
  } else {
    s.data_ = std::shared_ptr<void>(data, [](void*) {});
  }
  s.nbytes_ = nbytes;
  s.device_ = device;
  s.defined_ = true;
  return s;
}

}  // namespace tessera
