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

void produce_checked(const StreamedTensor& t, const StreamedTensor::Take& take,
                     const std::string& where) {
  const uint64_t bytes = static_cast<uint64_t>(numel_of(t.shape)) * itemsize(t.dtype);
  uint64_t given = 0;
  t.produce([&](const Tensor& piece) {
    TS_CHECK(piece.dtype() == t.dtype && piece.device().is_cpu() && piece.is_contiguous() &&
                 given + piece.nbytes() <= bytes,
             where, "tensor \"", t.name, "\": expected contiguous CPU ", dtype_name(t.dtype),
             " pieces of ", bytes, " bytes in all, found ", piece.str(), " after ", given,
             " bytes");
    take(piece);
    given += piece.nbytes();
  });
  TS_CHECK(given == bytes, where, "tensor \"", t.name, "\": expected ", bytes,
           " bytes, its pieces held ", given);
}

Tensor materialize(const StreamedTensor& t) {
  const Tensor out = empty(t.shape, {t.dtype});
  char* at = static_cast<char*>(out.raw_data());
  produce_checked(
      t,
      [&](const Tensor& piece) {
        if (piece.nbytes() > 0) std::memcpy(at, piece.raw_data(), piece.nbytes());
        at += piece.nbytes();
      },
      "[streamed] ");
  return out;
}

StateDict materialize(const StreamedStateDict& tensors) {
  StateDict out;
  out.reserve(tensors.size());
  for (const StreamedTensor& t : tensors) out.emplace_back(t.name, materialize(t));
  return out;
}

}  // namespace tessera
