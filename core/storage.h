// Storage: a reference-counted block of device memory shared by tensor views.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

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

  void* data() const { return data_.get(); }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool defined() const { return defined_; }
  // Number of Storage handles sharing this memory.
  long use_count() const { return data_.use_count(); }

 private:
  std::shared_ptr<void> data_;
  size_t nbytes_ = 0;
  Device device_;
  bool defined_ = false;
};

}  // namespace tessera
