// Embedding table: rows of "weight" (num_embeddings, dim) looked up by id.
#pragma once

#include "autograd/module.h"

namespace tessera {

class Embedding : public Layer {
 public:
  // "weight" is zero-initialized: models initialize by parameter name.
  Embedding(int64_t num_embeddings, int64_t embedding_dim, DType dtype = DType::f32);

  Tensor& weight() { return weight_; }
  const Tensor& weight() const { return weight_; }

 protected:
  Tensor forward(const Tensor& ids) const override;  // (...) i32|i64 -> (..., dim)

 private:
  Tensor weight_;
};

}  // namespace tessera
