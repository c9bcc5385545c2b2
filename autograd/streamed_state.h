// StreamedTensor: a named tensor whose values are produced piece by piece when a writer
// wants them, so that state larger than memory (NVMe-offloaded optimizer state: Note
// [Streamed checkpoints] in parallel/zero/zero_optimizer.h) can be written to a file
// without being in memory whole (write_safetensors in models/io/safetensors.h).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "autograd/module.h"
#include "core/tensor.h"

namespace tessera {

struct StreamedTensor {
  // Receives one piece: a contiguous CPU tensor of the entry's dtype, valid during the call.
  using Take = std::function<void(const Tensor& piece)>;

  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  // Passes the values to `take` in order (row-major), in pieces whose numels add up to
  // numel(shape). May be called more than once; each call produces the same values.
  std::function<void(const Take& take)> produce;
};
using StreamedStateDict = std::vector<StreamedTensor>;

// `t` (any device and layout) as one piece, moved to contiguous CPU memory when produced.
StreamedTensor streamed(std::string name, Tensor t);
StreamedStateDict streamed(const StateDict& tensors);

// Runs t.produce, passing each piece to `take` once checked (a contiguous CPU tensor of
// t.dtype within t's bytes), then checks the pieces held all of t's bytes; errors start with
// `where` and name the tensor.
void produce_checked(const StreamedTensor& t, const StreamedTensor::Take& take,
                     const std::string& where);

// The values whole, in a new CPU tensor (the reverse of streamed(); for tests and small
// state). Throws when the pieces do not fit the shape or dtype.
Tensor materialize(const StreamedTensor& t);
StateDict materialize(const StreamedStateDict& tensors);

}  // namespace tessera
