#include "autograd/streamed_state.h"

#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/factories.h"

namespace tessera {

StreamedTensor streamed(std::string name, Tensor t) {
  StreamedTensor s;
  s.name = std::move(name);
  s.dtype = t.dtype();
  s.shape = t.shape();
  s.produce = [t](const StreamedTensor::Take& take) {
    take(t.detach().to(Device::cpu()).contiguous());
  };
  return s;
}

StreamedStateDict streamed(const StateDict& tensors) {
  StreamedStateDict out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) out.push_back(streamed(name, t));
  return out;
}

Tensor materialize(const StreamedTensor& t) {
  const Tensor out = empty(t.shape, {t.dtype});
  const int64_t numel = out.numel();
  int64_t filled = 0;
  t.produce([&](const Tensor& piece) {
    TS_CHECK(piece.dtype() == t.dtype && piece.is_contiguous() && piece.device().is_cpu() &&
                 filled + piece.numel() <= numel,
             "[streamed] \"", t.name, "\": expected contiguous CPU ", dtype_name(t.dtype),
             " pieces of ", numel, " elements in all, found ", piece.str(), " after ", filled);
    if (piece.numel() > 0) {
      std::memcpy(
          static_cast<char*>(out.raw_data()) + filled * static_cast<int64_t>(itemsize(t.dtype)),
          piece.raw_data(), piece.nbytes());
    }
    filled += piece.numel();
  });
  TS_CHECK(filled == numel, "[streamed] \"", t.name, "\": expected ", numel,
           " elements, the pieces held ", filled);
  return out;
}

StateDict materialize(const StreamedStateDict& tensors) {
  StateDict out;
  out.reserve(tensors.size());
  for (const StreamedTensor& t : tensors) out.emplace_back(t.name, materialize(t));
  return out;
}

}  // namespace tessera
