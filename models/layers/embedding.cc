#include "models/layers/embedding.h"

#include "autograd/ops/nn.h"
#include "core/factories.h"

namespace tessera {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, DType dtype)
    : weight_(zeros({num_embeddings, embedding_dim}, {dtype})) {
  register_parameter("weight", weight_);
}

Tensor Embedding::forward(const Tensor& ids) const { return embedding(weight_, ids); }

}  // namespace tessera
