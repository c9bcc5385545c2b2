#include "models/layers/dropout.h"

#include "autograd/ops/nn.h"

namespace tessera {

Dropout::Dropout(double p, Generator& gen) : p_(p), gen_(&gen) {
  TS_CHECK(p >= 0.0 && p < 1.0, "[Dropout] expected p in [0, 1), found ", p);
}

Tensor Dropout::forward(const Tensor& x) const { return dropout(x, p_, *gen_, is_training()); }

}  // namespace tessera
