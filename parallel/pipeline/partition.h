// Splitting a model's layer sequence into pipeline stages with DeepSpeed's partition
// methods (PipelineModule._partition_layers in deepspeed/runtime/pipe/module.py, with
// partition_uniform and partition_balanced from deepspeed/runtime/utils.py). A partition
// is a list of S + 1
// boundaries: stage s owns layers [parts[s], parts[s + 1]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::parallel::pipeline {

// DeepSpeed's partition_uniform: n / S layers per stage, the first n % S stages one more;
// with n <= S, stage p starts at min(p, n). partition_uniform(10, 4) = [0, 3, 6, 8, 10].
std::vector<int> partition_uniform(int num_items, int num_parts);

// The contiguous split into num_parts non-empty parts with the smallest spread (largest
// part sum - smallest part sum); partition_uniform when there are no more items than parts.
// Weights must be >= 0. Note [Balanced partition].
std::vector<int> partition_balanced(const std::vector<double>& weights, int num_parts);

// Note [Balanced partition]
// DeepSpeed's partition_balanced is a dynamic program that keeps, for each prefix and part
// count, only the split of smallest spread so far (the later split point on ties). That is
// not always the smallest spread overall: for weights (2, 2, 7, 1, 9) in 4 parts it keeps
// (2 2 | 7 | 1 | 9), spread 8, where (2 | 2 | 7 1 | 9) has spread 7. We take DeepSpeed's
// answer when it is optimal, so configs split as they do under DeepSpeed, and otherwise an
// exact optimum: for every candidate smallest part (each contiguous sum), the smallest
// largest part with all parts at least that, by a second dynamic program.

// One layer as the partitioner sees it.
struct LayerInfo {
  std::string type;    // its class, matched by "type:<regex>" ("Block", "Embedding", ...)
  int64_t parameters;  // trainable parameter count, weighed by "parameters"
};

// The boundaries for `method`: "uniform", "parameters" (balanced by parameter count, the
// default), or "type:<regex>" (balanced over the layers whose type matches the regex,
// case-insensitive search). Throws for another method, and DeepSpeed's "Partitioning
// '<method>' found no valid layers to partition." when a type regex matches nothing.
std::vector<int> partition_layers(const std::vector<LayerInfo>& layers, int stages,
                                  const std::string& method);

// Throws unless `method` is one partition_layers accepts (for config validation); `where`
// names the config key in the message.
void check_partition_method(const std::string& method, const std::string& where);

}  // namespace tessera::parallel::pipeline
