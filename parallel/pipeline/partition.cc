#include "parallel/pipeline/partition.h"

#include <algorithm>
#include <limits>
#include <regex>

#include "core/error.h"

namespace tessera::parallel::pipeline {

std::vector<int> partition_uniform(int num_items, int num_parts) {
  TS_CHECK(num_items >= 0 && num_parts >= 1, "[pipeline] partition: expected items >= 0 and ",
           "parts >= 1, found ", num_items, " items and ", num_parts, " parts");
  std::vector<int> parts(num_parts + 1);
  if (num_items <= num_parts) {
    for (int p = 0; p <= num_parts; ++p) parts[p] = std::min(p, num_items);
    return parts;
  }
  const int chunk = num_items / num_parts, residual = num_items % num_parts;
  for (int p = 1; p <= num_parts; ++p) parts[p] = parts[p - 1] + chunk + (p <= residual ? 1 : 0);
  return parts;
}

namespace {

constexpr const char* kTypePrefix = "type:";

bool is_type_method(const std::string& method) { return method.rfind(kTypePrefix, 0) == 0; }

constexpr double kInf = std::numeric_limits<double>::infinity();

// Sums of contiguous items: sum(k, i) = items [k, i).
struct Prefix {
  std::vector<double> p;
  explicit Prefix(const std::vector<double>& w) : p(w.size() + 1, 0.0) {
    for (size_t i = 0; i < w.size(); ++i) p[i + 1] = p[i] + w[i];
  }
  double sum(int k, int i) const { return p[i] - p[k]; }
};

double spread_of(const Prefix& prefix, const std::vector<int>& parts) {
  double hi = -kInf, lo = kInf;
  for (size_t s = 0; s + 1 < parts.size(); ++s) {
    hi = std::max(hi, prefix.sum(parts[s], parts[s + 1]));
    lo = std::min(lo, prefix.sum(parts[s], parts[s + 1]));
  }
  return hi - lo;
}

// A table of (n + 1) x (m + 1) states: the first i items in j parts.
template <class T>
struct Table {
  int m;
  std::vector<T> v;
  Table(int n, int m_, T init) : m(m_), v(static_cast<size_t>(n + 1) * (m_ + 1), init) {}
  T& operator()(int i, int j) { return v[static_cast<size_t>(i) * (m + 1) + j]; }
};

// Walks the chosen last-part starts back from (n, m).
std::vector<int> backtrack(Table<int>& from, int n, int m) {
  std::vector<int> parts(m + 1);
  parts[m] = n;
  for (int j = m; j >= 1; --j) parts[j - 1] = from(parts[j], j);
  return parts;
}

// DeepSpeed's dynamic program (Note [Balanced partition]).
std::vector<int> deepspeed_balanced(const Prefix& prefix, int n, int m) {
  Table<double> max_sum(n, m, kInf), min_sum(n, m, kInf), cost(n, m, kInf);
  Table<int> from(n, m, 0);
  max_sum(0, 0) = 0;
  cost(0, 0) = 0;
  for (int i = 1; i <= n; ++i) {
    for (int j = 1; j <= std::min(i, m); ++j) {
      for (int k = 0; k < i; ++k) {
        const double hi = std::max(max_sum(k, j - 1), prefix.sum(k, i));
        const double lo = std::min(min_sum(k, j - 1), prefix.sum(k, i));
        if (cost(i, j) >= hi - lo) {  // >=: the later split wins ties
          cost(i, j) = hi - lo;
          max_sum(i, j) = hi;
          min_sum(i, j) = lo;
          from(i, j) = k;
        }
      }
    }
  }
  return backtrack(from, n, m);
}

// The split of smallest largest part among those whose parts are all >= floor; empty when
// there is none.
std::vector<int> smallest_max_above(const Prefix& prefix, int n, int m, double floor) {
  Table<double> best(n, m, kInf);
  Table<int> from(n, m, 0);
  best(0, 0) = 0;
  for (int i = 1; i <= n; ++i) {
    for (int j = 1; j <= std::min(i, m); ++j) {
      for (int k = j - 1; k < i; ++k) {
        const double part = prefix.sum(k, i);
        if (part < floor || best(k, j - 1) == kInf) continue;
        const double hi = std::max(best(k, j - 1), part);
        if (hi < best(i, j)) best(i, j) = hi, from(i, j) = k;
      }
    }
  }
  if (best(n, m) == kInf) return {};
  return backtrack(from, n, m);
}

}  // namespace

std::vector<int> partition_balanced(const std::vector<double>& weights, int num_parts) {
  const int n = static_cast<int>(weights.size()), m = num_parts;
  TS_CHECK(m >= 1, "[pipeline] partition: expected parts >= 1, found ", m);
  for (double w : weights) {
    TS_CHECK(w >= 0, "[pipeline] partition: expected weights >= 0, found ", w);
  }
  if (n <= m) return partition_uniform(n, m);
  const Prefix prefix(weights);
  std::vector<int> best = deepspeed_balanced(prefix, n, m);
  double best_spread = spread_of(prefix, best);
  // The smallest part of an optimal split is one of the contiguous sums (at most the mean).
  std::vector<double> floors;
  for (int k = 0; k < n; ++k) {
    for (int i = k + 1; i <= n && prefix.sum(k, i) * m <= prefix.sum(0, n); ++i) {
      floors.push_back(prefix.sum(k, i));
    }
  }
  std::sort(floors.begin(), floors.end());
  floors.erase(std::unique(floors.begin(), floors.end()), floors.end());
  for (double floor : floors) {
    const std::vector<int> parts = smallest_max_above(prefix, n, m, floor);
    if (parts.empty()) continue;
    const double spread = spread_of(prefix, parts);
    if (spread < best_spread) best = parts, best_spread = spread;
  }
  return best;
}

void check_partition_method(const std::string& method, const std::string& where) {
  if (method == "uniform" || method == "parameters") return;
  TS_CHECK(method != "profile", "[config] ", where,
           ": partition method \"profile\" is not implemented (DeepSpeed does not implement it "
           "either); expected \"parameters\", \"uniform\" or \"type:<regex>\"");
  TS_CHECK(is_type_method(method), "[config] ", where, ": expected \"parameters\", \"uniform\" ",
           "or \"type:<regex>\", found \"", method, "\"");
  try {
    std::regex(method.substr(5), std::regex::icase);
  } catch (const std::regex_error& e) {
    TS_FAIL("[config] ", where, ": \"", method, "\" is not a valid regular expression (", e.what(),
            ")");
  }
}

std::vector<int> partition_layers(const std::vector<LayerInfo>& layers, int stages,
                                  const std::string& method) {
  check_partition_method(method, "pipeline.partition_method");
  const int n = static_cast<int>(layers.size());
  if (method == "uniform") return partition_uniform(n, stages);
  std::vector<double> weights;
  if (method == "parameters") {
    for (const LayerInfo& l : layers) weights.push_back(static_cast<double>(l.parameters));
  } else {
    const std::regex pattern(method.substr(5), std::regex::icase);
    bool any = false;
    for (const LayerInfo& l : layers) {
      const bool match = std::regex_search(l.type, pattern);
      any = any || match;
      weights.push_back(match ? 1.0 : 0.0);
    }
    TS_CHECK(any, "[pipeline] Partitioning '", method.substr(5),
             "' found no valid layers to partition.");
  }
  return partition_balanced(weights, stages);
}

}  // namespace tessera::parallel::pipeline
