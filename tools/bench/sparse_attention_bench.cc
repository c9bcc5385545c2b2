// sparse_attention_bench: forward+backward time and peak memory of one attention layer,
// dense against DeepSpeed's block-sparse layouts, next to DeepSpeed's claims for its sparse
// attention ("10x longer sequences", "up to 6.3x faster").
//
//   bazel run //tools/bench:sparse_attention_bench [-- --max_len 16384 --block 32 ...]
//
// One layer: B = 1, H = 12, D = 64, f32, q k v (B, H, T, D) in, out (B, H, T, D), backward
// with a random upstream gradient. The references are measured in the same run:
//   - materialized dense: softmax(q k^T / sqrt(D)) v with the (B, H, T, T) scores, what
//     DeepSpeed compares its sparse attention against (bidirectional);
//   - flash causal: our fused causal_attention (no (T, T) matrix, O(T) memory), the strong
//     reference for the causal (GPT) case.
// Peak memory is the CPU allocator's high-water mark during one fwd+bwd minus the bytes
// live before it (q, k, v, dout and the layout tables), so it counts the activations, the
// temporaries and the three input gradients.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "core/allocator.h"
#include "core/clock.h"
#include "core/factories.h"
#include "core/parallel.h"
#include "models/sparse/sparse_self_attention.h"
#include "models/sparse/sparsity_config.h"
#include "tools/cli/flags.h"

namespace tessera {
namespace {

constexpr const char* kUsage = R"(usage: sparse_attention_bench [--max_len T] [--block 16|32]
                              [--reps N] [--budget_gb G] [--flash_max_len T]

Forward+backward time and peak memory of one attention layer (B=1, H=12, D=64, f32) at
T = 1024, 2048, ... up to --max_len: materialized dense, flash causal and block-sparse
layouts (fixed, bigbird, bslongformer; fixed unidirectional with causal masking).

  --max_len T        longest sequence measured (default 16384)
  --block B          sparse block edge, 16 or 32 (default 32)
  --reps N           timed runs after a warm-up, of which the median is reported (default 3);
                     one timed run when the warm-up took over 2 s
  --budget_gb G      memory budget for "longest T that fits", and the limit above which the
                     materialized dense reference is skipped (default 8)
  --flash_max_len T  longest T at which flash causal is measured (default 8192: at 16384
                     its fwd+bwd is ~1.4 TFLOP, tens of seconds on two cores)
  --help             print this and exit
)";

constexpr int64_t kHeads = 12;
constexpr int64_t kDim = 64;
constexpr double kSingleRunSeconds = 2.0;  // a first run slower than this is the only one
constexpr double kMB = 1e6;

struct Inputs {
  Tensor q, k, v, dout;  // (1, H, T, D)
};

Inputs make_inputs(int64_t len, uint64_t seed) {
  Generator gen(seed);
  const Shape shape{1, kHeads, len, kDim};
  Inputs x{randn(shape, gen), randn(shape, gen), randn(shape, gen), randn(shape, gen)};
  for (Tensor* t : {&x.q, &x.k, &x.v}) t->set_requires_grad(true);
  return x;
}

using Attend = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>;

// softmax(q k^T / sqrt(D)) v through the (B, H, T, T) scores and probabilities.
Tensor materialized_dense(const Tensor& q, const Tensor& k, const Tensor& v) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const Tensor scores = mul(matmul(q, transpose(k, 2, 3)), scalar_like(q, scale));  // (B,H,T,T)
  return matmul(softmax(scores), v);
}

struct Timing {
  double fwd_s = 0;    // forward alone
  double total_s = 0;  // forward + backward
};

// One forward and backward from cleared input gradients.
Timing run_once(const Inputs& x, const Attend& attend) {
  for (const Tensor* t : {&x.q, &x.k, &x.v}) t->set_grad(Tensor());
  const auto start = std::chrono::steady_clock::now();
  Timing t;
  {
    const Tensor out = attend(x.q, x.k, x.v);
    t.fwd_s = seconds_since(start);
    backward(out, x.dout);
  }
  t.total_s = seconds_since(start);
  return t;
}

struct Measured {
  Timing time;       // medians
  int runs = 0;      // timed runs behind the medians
  int64_t peak = 0;  // allocator bytes above those live before the run
};

// The first run is the warm-up and gives the peak (its fresh pages would be counted in its
// time); then `reps` timed runs, or one when the warm-up took over kSingleRunSeconds.
Measured measure(const Inputs& x, const Attend& attend, int reps) {
  Allocator& cpu = allocator_for(Device::cpu());
  for (const Tensor* t : {&x.q, &x.k, &x.v}) t->set_grad(Tensor());
  const int64_t before = cpu.stats().allocated;
  cpu.reset_peak();
  const Timing warm_up = run_once(x, attend);
  Measured m;
  m.peak = cpu.stats().peak_allocated - before;
  if (warm_up.total_s > kSingleRunSeconds) reps = 1;
  std::vector<double> fwd, total;
  for (int i = 0; i < reps; ++i) {
    const Timing t = run_once(x, attend);
    fwd.push_back(t.fwd_s);
    total.push_back(t.total_s);
  }
  std::sort(fwd.begin(), fwd.end());
  std::sort(total.begin(), total.end());
  m.time = {fwd[fwd.size() / 2], total[total.size() / 2]};
  m.runs = reps;
  return m;
}

struct Layout {
  std::string name;
  SparsityConfig config;
  bool causal = false;
};

std::vector<Layout> sparse_layouts(int64_t block) {
  std::vector<Layout> layouts;
  SparsityConfig fixed;
  fixed.mode = SparsityMode::fixed;
  fixed.block = block;
  fixed.num_local_blocks = 4;
  fixed.num_global_blocks = 1;
  layouts.push_back({"sparse fixed", fixed, false});
  SparsityConfig bigbird;
  bigbird.mode = SparsityMode::bigbird;
  bigbird.block = block;
  bigbird.num_random_blocks = 1;
  bigbird.num_sliding_window_blocks = 3;
  bigbird.num_global_blocks = 1;
  layouts.push_back({"sparse bigbird", bigbird, false});
  SparsityConfig longformer;
  longformer.mode = SparsityMode::bslongformer;
  longformer.block = block;
  longformer.num_sliding_window_blocks = 3;
  longformer.global_block_indices = {0};
  layouts.push_back({"sparse bslongformer", longformer, false});
  SparsityConfig fixed_uni = fixed;
  fixed_uni.unidirectional = true;
  layouts.push_back({"sparse fixed uni", fixed_uni, true});
  for (const Layout& l : layouts) l.config.validate();
  return layouts;
}

// Largest |a - b| over the elements.
double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  double d = 0;
  for (size_t i = 0; i < va.size(); ++i) d = std::max(d, std::abs(va[i] - vb[i]));
  return d;
}

// The largest output or input-gradient difference of two implementations.
double compare(const Inputs& x, const Attend& a, const Attend& b) {
  std::vector<Tensor> ra, rb;
  for (auto [attend, result] : {std::pair{&a, &ra}, std::pair{&b, &rb}}) {
    for (const Tensor* t : {&x.q, &x.k, &x.v}) t->set_grad(Tensor());
    const Tensor out = (*attend)(x.q, x.k, x.v);
    backward(out, x.dout);
    *result = {out.detach(), x.q.grad(), x.k.grad(), x.v.grad()};
  }
  double d = 0;
  for (size_t i = 0; i < ra.size(); ++i) d = std::max(d, max_abs_diff(ra[i], rb[i]));
  return d;
}

// The sparse kernels in the dense layout against materialized dense attention, and causal
// against flash causal: the timings below are of a correct kernel. Throws when they differ.
void check_correctness(int64_t block) {
  constexpr int64_t kLen = 256;
  constexpr double kTolerance = 1e-4;
  const Inputs x = make_inputs(kLen, 7);
  SparsityConfig dense;
  dense.mode = SparsityMode::dense;
  dense.block = block;
  const SparseSelfAttention attn(dense, kHeads, kLen, 1337);
  const auto sparse = [&](bool causal) -> Attend {
    return [&attn, causal](const Tensor& q, const Tensor& k, const Tensor& v) {
      return attn.forward(q, k, v, causal);
    };
  };
  const auto flash = [](const Tensor& q, const Tensor& k, const Tensor& v) {
    return causal_attention(q, k, v);
  };
  const double bidir = compare(x, sparse(false), materialized_dense);
  const double causal = compare(x, sparse(true), flash);
  std::printf(
      "correctness (T=%lld, block %lld, out and dq dk dv): sparse dense layout vs materialized "
      "max |diff| %.1e, causal vs flash %.1e (tolerance %.0e)\n",
      static_cast<long long>(kLen), static_cast<long long>(block), bidir, causal, kTolerance);
  TS_CHECK(bidir <= kTolerance && causal <= kTolerance,
           "[sparse_attention_bench] the sparse kernels disagree with dense attention (max |diff| ",
           std::max(bidir, causal), " > ", kTolerance, "); not benchmarking a wrong kernel");
}

struct Row {
  std::string method;
  bool causal = false;
  double density = 1.0;
  std::optional<Measured> m;
  std::string skipped;  // why m is empty
};

constexpr const char* kMaterialized = "dense materialized";
constexpr const char* kFlash = "dense flash";

bool is_sparse(const Row& r) { return r.method.rfind("sparse", 0) == 0; }

std::string fmt(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

// Every row of every length, in the order measured.
using Results = std::map<int64_t, std::vector<Row>>;

const Row* find(const std::vector<Row>& rows, const std::string& method) {
  for (const Row& r : rows) {
    if (r.method == method && r.m) return &r;
  }
  return nullptr;
}

// The largest measured T of `method` below or at `len`, with its row.
std::optional<std::pair<int64_t, const Row*>> last_measured(const Results& results,
                                                            const std::string& method,
                                                            int64_t len) {
  std::optional<std::pair<int64_t, const Row*>> last;
  for (const auto& [t, rows] : results) {
    if (t > len) break;
    if (const Row* r = find(rows, method)) last = {t, r};
  }
  return last;
}

// Bidirectional rows compare with materialized dense, causal rows with flash causal. Where
// materialized dense was skipped, "~" marks its time extrapolated as T^2 from the largest
// T it was measured at.
void print_table(const Results& results, int64_t len, double input_mb) {
  const std::vector<Row>& rows = results.at(len);
  std::printf("\nT = %lld (q, k, v, dout: %.0f MB, not in peak)\n", static_cast<long long>(len),
              input_mb);
  std::printf("%-20s %-6s %8s %10s %12s %4s %9s %9s %10s\n", "method", "mask", "density", "fwd ms",
              "fwd+bwd ms", "runs", "vs mat.", "vs flash", "peak MB");
  const auto mat = last_measured(results, kMaterialized, len);
  const Row* flash = find(rows, kFlash);
  for (const Row& r : rows) {
    std::printf("%-20s %-6s %8.4f ", r.method.c_str(), r.causal ? "causal" : "bidir", r.density);
    if (!r.m) {
      std::printf("%s\n", r.skipped.c_str());
      continue;
    }
    const double t = r.m->time.total_s;
    std::string vs_mat = "-";
    if (mat && !r.causal) {
      const double scaled = std::pow(static_cast<double>(len) / mat->first, 2);
      vs_mat =
          (mat->first == len ? "" : "~") + fmt("%.2fx", mat->second->m->time.total_s * scaled / t);
    }
    const std::string vs_flash = flash && r.causal ? fmt("%.2fx", flash->m->time.total_s / t) : "-";
    std::printf("%10.1f %12.1f %4d %9s %9s %10.1f\n", 1e3 * r.m->time.fwd_s, 1e3 * t, r.m->runs,
                vs_mat.c_str(), vs_flash.c_str(), r.m->peak / kMB);
  }
  std::fflush(stdout);
}

// The longest T whose peak fits `budget` bytes, from measured (T, peak) points: within the
// measured range, the power law between the two lengths around the crossing; past it, the
// power law of the two largest lengths (or `exponent` when positive) carried on.
struct Fit {
  double len = 0;  // 0: too few points
  std::string basis;
};

Fit longest_fit(const std::vector<std::pair<int64_t, int64_t>>& points, double budget,
                double exponent) {
  Fit f;
  if (points.empty()) return f;
  size_t hi = points.size() - 1;
  for (size_t i = 0; i < points.size(); ++i) {
    if (static_cast<double>(points[i].second) > budget) {
      hi = std::min(std::max<size_t>(i, 1), points.size() - 1);
      break;
    }
  }
  const auto [t1, p1] = points[hi];
  double p = exponent;
  std::string from = fmt("T=%.0f", static_cast<double>(t1));
  if (p <= 0) {
    if (hi == 0) return f;
    const auto [t0, p0] = points[hi - 1];
    p = std::log(static_cast<double>(p1) / p0) / std::log(static_cast<double>(t1) / t0);
    from = fmt("T=%.0f", static_cast<double>(t0)) + fmt(" and %.0f", static_cast<double>(t1));
  }
  f.len = t1 * std::pow(budget / p1, 1.0 / p);
  f.basis = (f.len > t1 ? "extrapolated from " : "interpolated between ") + from +
            fmt(", peak ~ T^%.2f", p);
  return f;
}

void print_summary(const Results& results, double budget_gb) {
  std::printf("\nlongest T that fits in %.1f GB (peak of one layer's fwd+bwd as above):\n",
              budget_gb);
  std::printf("%-20s %12s %10s  %s\n", "method", "longest T", "vs mat.", "basis");
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> peaks;  // method -> (T, peak)
  for (const auto& [len, rows] : results) {
    for (const Row& r : rows) {
      if (std::find(order.begin(), order.end(), r.method) == order.end()) order.push_back(r.method);
      if (r.m) peaks[r.method].push_back({len, r.m->peak});
    }
  }
  // Materialized dense holds (B, H, T, T) tensors: T^2 from its largest measured T.
  const Fit mat = longest_fit(peaks[kMaterialized], budget_gb * 1e9, 2.0);
  std::string longer;
  for (const std::string& method : order) {
    const Fit f = longest_fit(peaks[method], budget_gb * 1e9, method == kMaterialized ? 2.0 : 0.0);
    if (f.len <= 0) {
      std::printf("%-20s %12s %10s  too few measured lengths\n", method.c_str(), "-", "-");
      continue;
    }
    const std::string ratio = mat.len > 0 ? fmt("%.1fx", f.len / mat.len) : "-";
    if (method.rfind("sparse", 0) == 0)
      longer += (longer.empty() ? "" : ", ") + method + " " + ratio;
    std::printf("%-20s %12.0f %10s  %s\n", method.c_str(), f.len, ratio.c_str(), f.basis.c_str());
  }

  // Speedups at the largest T each reference was measured at.
  const auto speedups = [&](const char* reference, bool causal) {
    std::string out = "- (not measured)";
    for (const auto& [len, rows] : results) {
      const Row* ref = find(rows, reference);
      if (!ref) continue;
      out = fmt("at T=%.0f: ", static_cast<double>(len));
      for (const Row& r : rows) {
        if (!is_sparse(r) || r.causal != causal || !r.m) continue;
        out += r.method + fmt(" %.2fx, ", ref->m->time.total_s / r.m->time.total_s);
      }
      out.resize(out.size() - 2);
    }
    return out;
  };
  std::printf("\nDeepSpeed's claims next to this run (measured values only):\n");
  std::printf("  \"10x longer sequences\": in %.1f GB, vs materialized dense: %s\n", budget_gb,
              longer.empty() ? "-" : longer.c_str());
  std::printf("  \"up to 6.3x faster\":    fwd+bwd vs materialized dense %s\n",
              speedups(kMaterialized, false).c_str());
  std::printf("                          causal, vs flash causal %s\n",
              speedups(kFlash, true).c_str());
}

int bench_main(int argc, char** argv) {
  using cli::Flag;
  const cli::Flags flags(argc, argv,
                         {{"max_len", Flag::kValue},
                          {"block", Flag::kValue},
                          {"reps", Flag::kValue},
                          {"budget_gb", Flag::kValue},
                          {"flash_max_len", Flag::kValue}});
  if (flags.has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const int64_t max_len = flags.get_int("max_len", 16384);
  const int64_t block = flags.get_int("block", 32);
  const int reps = static_cast<int>(flags.get_int("reps", 3));
  const double budget_gb = flags.get_double("budget_gb", 8.0);
  const int64_t flash_max_len = flags.get_int("flash_max_len", 8192);
  if (max_len < 1024) throw cli::UsageError("--max_len expected at least 1024");
  if (block != 16 && block != 32) throw cli::UsageError("--block expected 16 or 32");
  if (reps < 1) throw cli::UsageError("--reps expected at least 1");
  if (!(budget_gb > 0)) throw cli::UsageError("--budget_gb expected a positive number");

  std::printf(
      "sparse_attention_bench: one attention layer fwd+bwd, B=1 H=%lld D=%lld f32, block %lld, "
      "%d threads\n",
      static_cast<long long>(kHeads), static_cast<long long>(kDim), static_cast<long long>(block),
      num_threads());
  std::printf(
      "ms: median of %d runs after a warm-up (runs=1: one run, when the warm-up took > %.0f s); "
      "density: nonzero blocks / (H nb^2);\npeak: allocator high-water mark minus the bytes live "
      "before (activations, temporaries, dq dk dv); MB = 1e6 bytes\n",
      reps, kSingleRunSeconds);
  check_correctness(block);

  const std::vector<Layout> layouts = sparse_layouts(block);
  Results results;
  const auto wall = std::chrono::steady_clock::now();
  for (int64_t len = 1024; len <= max_len; len *= 2) {
    const Inputs x = make_inputs(len, 1);
    std::vector<Row>& rows = results[len];
    // Materialized dense holds at least scores, probs and a gradient of (B, H, T, T) at once;
    // from the largest measured T its measured peak, scaled as T^2, is the prediction.
    Row mat{kMaterialized, false, 1.0, {}, {}};
    double predicted = 3.0 * kHeads * len * len * 4;
    if (const auto last = last_measured(results, kMaterialized, len)) {
      predicted = std::max(
          predicted, last->second->m->peak * std::pow(static_cast<double>(len) / last->first, 2));
    }
    if (predicted > budget_gb * 1e9) {
      mat.skipped =
          fmt("skipped: needs ~%.1f GB", predicted / 1e9) + fmt(" > --budget_gb %.1f", budget_gb);
    } else {
      mat.m = measure(x, materialized_dense, reps);
    }
    rows.push_back(mat);
    Row flash{kFlash, true, (len + 1) / (2.0 * len), {}, {}};  // the causal triangle's share
    if (len > flash_max_len) {
      flash.skipped = fmt("skipped: T > --flash_max_len %.0f", static_cast<double>(flash_max_len));
    } else {
      flash.m = measure(
          x,
          [](const Tensor& q, const Tensor& k, const Tensor& v) {
            return causal_attention(q, k, v);
          },
          reps);
    }
    rows.push_back(flash);
    for (const Layout& l : layouts) {
      // One layout per length, built for it (a master layout's corner would lose the random
      // blocks that fall outside it).
      const SparseSelfAttention attn(l.config, kHeads, len, 1337);
      const kernels::BlockLayout& table = attn.block_layout(len, Device::cpu());  // built now
      Row r{l.name, l.causal, 0.0, {}, {}};
      r.density = static_cast<double>(table.nnz) / (kHeads * table.blocks * table.blocks);
      r.m = measure(
          x,
          [&attn, causal = l.causal](const Tensor& q, const Tensor& k, const Tensor& v) {
            return attn.forward(q, k, v, causal);
          },
          reps);
      rows.push_back(r);
    }
    print_table(results, len, 4.0 * x.q.nbytes() / kMB);
  }
  print_summary(results, budget_gb);
  std::printf("total wall time %.0f s\n", seconds_since(wall));
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  return tessera::cli::run_tool("sparse_attention_bench", tessera::kUsage, tessera::bench_main,
                                argc, argv);
}
