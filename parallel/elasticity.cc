#include "parallel/elasticity.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <sstream>

#include "core/error.h"

namespace tessera::parallel {
namespace {

// DeepSpeed's HCN_LIST: highly composite numbers, the scale factors of the candidates.
constexpr int64_t kHighlyComposite[] = {
    1,      2,      4,      6,      12,     24,     36,     48,    60,    120,
    180,    240,    360,    720,    840,    1260,   1680,   2520,  5040,  7560,
    10080,  15120,  20160,  25200,  27720,  45360,  50400,  55440, 83160, 110880,
    166320, 221760, 277200, 332640, 498960, 554400, 665280, 720720};

std::string list_str(const std::vector<int64_t>& v) {
  std::ostringstream out;
  for (size_t i = 0; i < v.size(); ++i) out << (i ? ", " : "") << v[i];
  return out.str();
}

// a * b, or a config error naming `what` when it overflows.
int64_t product(int64_t a, int64_t b, const char* what) {
  int64_t p = 0;
  TS_CHECK(!__builtin_mul_overflow(a, b, &p), "[config] $.elasticity: ", what, " overflows: ", a,
           " * ", b);
  return p;
}

// The world sizes that train `batch` with a micro-batch from `micro` (Note [Elastic batch]).
std::vector<int64_t> valid_world_sizes(int64_t batch, const std::vector<int64_t>& micro,
                                       int64_t min_gpus, int64_t max_gpus) {
  std::set<int64_t> valid;
  const auto add = [&](int64_t i, int64_t limit) {
    if (i <= limit && i >= min_gpus && i <= max_gpus) valid.insert(i);
  };
  for (const int64_t mb : micro) {
    if (batch % mb != 0) continue;
    const int64_t g = batch / mb;
    add(g, g);
    // g's divisors up to g / 2, found in pairs (i, g / i) up to sqrt(g).
    for (int64_t i = 1; i <= g / i; ++i) {
      if (g % i != 0) continue;
      add(i, g / 2);
      add(g / i, g / 2);
    }
  }
  return {valid.begin(), valid.end()};
}

// Version 0.1's search (DeepSpeed's _get_compatible_gpus_v01).
ElasticBatch search(const std::vector<int64_t>& micro, int64_t max_batch, int64_t min_gpus,
                    int64_t max_gpus, bool prefer_larger) {
  for (const int64_t mb : micro) {
    TS_CHECK(mb <= max_batch, "[config] $.elasticity.micro_batch_sizes: ", mb,
             " is larger than the maximum batch, ", max_batch,
             " (max_train_batch_size; per node with version 0.2); expected micro-batch sizes at "
             "most that");
  }
  int64_t lcm = 1;
  for (const int64_t mb : micro) {
    lcm = product(lcm / std::gcd(lcm, mb), mb, "the micro-batch sizes' least common multiple");
  }
  std::vector<int64_t> bases = micro;
  bases.push_back(lcm);
  std::set<int64_t> candidates;
  for (const int64_t b : bases) {
    if (b >= max_batch) {
      candidates.insert(b);  // DeepSpeed's quirk: the batch may exceed the maximum
      continue;
    }
    int64_t scale = 1;
    for (const int64_t h : kHighlyComposite) {
      if (h <= max_batch / b) scale = h;
    }
    candidates.insert(product(b, scale, "a candidate batch"));
  }
  ElasticBatch best{*std::min_element(micro.begin(), micro.end()), {}};
  size_t best_count = 0;
  for (const int64_t batch : candidates) {
    std::vector<int64_t> valid = valid_world_sizes(batch, micro, min_gpus, max_gpus);
    const bool tie_wins =
        prefer_larger ? batch > best.train_batch_size : batch < best.train_batch_size;
    if (valid.size() > best_count || (valid.size() == best_count && tie_wins)) {
      best_count = valid.size();
      best = {batch, std::move(valid)};
    }
  }
  return best;
}

}  // namespace

ElasticityConfig ElasticityConfig::from_json(JsonObjectReader s) {
  ElasticityConfig c;
  c.enabled = s.get<bool>("enabled", false);
  constexpr int64_t kMax = int64_t{1} << 40;
  if (c.enabled) {
    c.max_train_batch_size = s.required_in_range<int64_t>("max_train_batch_size", 1, kMax);
    c.micro_batch_sizes = s.required<std::vector<int64_t>>("micro_batch_sizes");
  } else {
    c.max_train_batch_size =
        s.get_in_range<int64_t>("max_train_batch_size", c.max_train_batch_size, 1, kMax);
    c.micro_batch_sizes = s.get<std::vector<int64_t>>("micro_batch_sizes", c.micro_batch_sizes);
  }
  TS_CHECK(!c.micro_batch_sizes.empty(), "[config] ", s.key_path("micro_batch_sizes"),
           ": expected a list of integers > 0, found an empty list");
  for (const int64_t mb : c.micro_batch_sizes) {
    TS_CHECK(mb > 0 && mb <= kMax, "[config] ", s.key_path("micro_batch_sizes"),
             ": expected integers > 0, found ", mb);
  }
  c.min_gpus = s.get_in_range<int64_t>("min_gpus", c.min_gpus, 1, kMax);
  c.max_gpus = s.get_in_range<int64_t>("max_gpus", c.max_gpus, 1, kMax);
  TS_CHECK(c.max_gpus >= c.min_gpus, "[config] ", s.key_path("max_gpus"),
           ": expected at least min_gpus (", c.min_gpus, "), found ", c.max_gpus);
  c.model_parallel_size = s.get_in_range<int64_t>("model_parallel_size", 1, 1, kMax);
  c.num_gpus_per_node = s.get_in_range<int64_t>("num_gpus_per_node", 1, 1, kMax);
  // DeepSpeed checks it and never reads it again.
  s.get_in_range<double>("min_time", 0.0, 0.0, 1e30);
  c.prefer_larger_batch = s.get<bool>("prefer_larger_batch", true);
  c.ignore_non_elastic_batch_info = s.get<bool>("ignore_non_elastic_batch_info", false);
  c.version = s.get<double>("version", c.version);
  TS_CHECK(c.version == 0.1 || c.version == 0.2, "[config] ", s.key_path("version"),
           ": expected 0.1 or 0.2 (the versions of DeepSpeed's algorithm), found ", c.version);
  TS_CHECK(c.model_parallel_size == 1 || c.version == 0.2, "[config] ",
           s.key_path("model_parallel_size"), ": ", c.model_parallel_size,
           " needs version 0.2; found version ", c.version);
  TS_CHECK(c.version != 0.2 || c.num_gpus_per_node % c.model_parallel_size == 0, "[config] ",
           s.key_path("num_gpus_per_node"), ": expected a multiple of model_parallel_size (",
           c.model_parallel_size, "), found ", c.num_gpus_per_node);
  return c;
}

ElasticBatch elastic_batch(const ElasticityConfig& c, int64_t world) {
  if (c.version == 0.1) {
    return search(c.micro_batch_sizes, c.max_train_batch_size, c.min_gpus, c.max_gpus,
                  c.prefer_larger_batch);
  }
  // Version 0.2: the search over whole nodes of dp_per_node data-parallel ranks.
  const int64_t per_node = c.num_gpus_per_node / c.model_parallel_size;
  const int64_t min_nodes = std::max<int64_t>(1, c.min_gpus / c.num_gpus_per_node);
  const int64_t max_nodes = c.max_gpus / c.num_gpus_per_node;
  ElasticBatch b = search(c.micro_batch_sizes, c.max_train_batch_size / per_node, min_nodes,
                          max_nodes, c.prefer_larger_batch);
  b.train_batch_size = product(b.train_batch_size, per_node, "the elastic batch");
  for (int64_t& n : b.valid_world_sizes) n = product(n, per_node, "a valid world size");
  if (std::binary_search(b.valid_world_sizes.begin(), b.valid_world_sizes.end(), world)) return b;
  // DeepSpeed's fall-back: the largest (or smallest) multiple of micro x world within the
  // maximum, for this world alone. DeepSpeed's dp, world x mp / gpn x (gpn / mp), is the
  // world itself, as num_gpus_per_node is a multiple of model_parallel_size; multiples of
  // 0 (a micro-batch x world above the maximum) do not count.
  ElasticBatch fallback{0, {world}};
  for (const int64_t mb : c.micro_batch_sizes) {
    const int64_t unit = product(mb, world, "micro-batch x world");
    const int64_t batch = c.max_train_batch_size / unit * unit;
    if (batch == 0) continue;
    if (fallback.train_batch_size == 0 ||
        (c.prefer_larger_batch ? batch > fallback.train_batch_size
                               : batch < fallback.train_batch_size)) {
      fallback.train_batch_size = batch;
    }
  }
  TS_CHECK(fallback.train_batch_size > 0, "[config] $.elasticity: ", world,
           " data-parallel ranks times every micro-batch size exceed max_train_batch_size (",
           c.max_train_batch_size, "); expected fewer ranks or a larger maximum");
  return fallback;
}

int64_t elastic_micro_batch(const ElasticityConfig& c, const ElasticBatch& b, int64_t world) {
  TS_CHECK(std::binary_search(b.valid_world_sizes.begin(), b.valid_world_sizes.end(), world),
           "[config] $.elasticity: ", world,
           " data-parallel ranks cannot train the elastic batch of ", b.train_batch_size,
           "; expected one of the valid world sizes (", list_str(b.valid_world_sizes), ")");
  int64_t micro = 0;
  for (const int64_t mb : c.micro_batch_sizes) {
    if ((b.train_batch_size / world) % mb == 0) micro = std::max(micro, mb);
  }
  TS_CHECK(micro > 0, "[config] $.elasticity: no micro-batch size of (",
           list_str(c.micro_batch_sizes), ") divides ", b.train_batch_size / world,
           ", the batch per rank at ", world, " ranks");
  return micro;
}

}  // namespace tessera::parallel
