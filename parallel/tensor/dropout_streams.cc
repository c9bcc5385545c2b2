#include "parallel/tensor/dropout_streams.h"

namespace tessera::parallel {

DropoutStreams::DropoutStreams(uint64_t seed, const std::string& name, int model_rank)
    : replicated_key_(Generator::for_name(seed, name).seed()),
      sliced_key_(
          Generator::for_name(seed, name + " tensor-parallel rank " + std::to_string(model_rank))
              .seed()),
      replicated_(replicated_key_),
      sliced_(sliced_key_) {}

void DropoutStreams::key_for_step(int64_t step) {
  const std::string name = "step " + std::to_string(step);
  replicated_ = Generator(hash_name(replicated_key_, name));
  sliced_ = Generator(hash_name(sliced_key_, name));
}

}  // namespace tessera::parallel
