#include "tools/trainer/flops_profiler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <typeinfo>

#include "core/error.h"

namespace tessera::train {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double numel(const Shape& s) { return static_cast<double>(numel_of(s)); }

// Python's "%g" of `v` rounded to two decimals, as DeepSpeed formats its numbers.
std::string g2(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g", std::round(v * 100) / 100);
  return buf;
}

std::string percent(double part, double whole) {
  return g2(whole > 0 ? 100 * part / whole : 0) + "%";
}

// DeepSpeed's params_to_string: G as B, no trailing space.
std::string params_to_string(double v) {
  std::string s = number_to_string(v);
  if (!s.empty() && s.back() == 'G') s.back() = 'B';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// '{:<70}  {:<8}' of a summary line.
std::string line(const std::string& label, const std::string& value) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%-70s  %-8s\n", label.c_str(), value.c_str());
  return buf;
}

}  // namespace

FlopsProfilerConfig read_flops_profiler_config(JsonObjectReader& root) {
  JsonObjectReader s = root.object("flops_profiler");
  FlopsProfilerConfig c;
  c.enabled = s.get<bool>("enabled", false);
  c.recompute_fwd_factor = s.get_in_range<double>("recompute_fwd_factor", 0.0, 0.0, 1e3);
  c.profile_step = s.get_in_range<int64_t>("profile_step", 1, 0, int64_t{1} << 62);
  c.module_depth = s.get_in_range<int64_t>("module_depth", -1, -1, 1 << 20);
  c.top_modules = s.get_in_range<int64_t>("top_modules", 1, 1, 1 << 20);
  c.detailed = s.get<bool>("detailed", true);
  if (const nlohmann::json* out = s.raw("output_file")) {
    TS_CHECK(out->is_null() || out->is_string(), "[config] ", s.key_path("output_file"),
             ": expected a path or null, found ", out->dump());
    if (out->is_string()) c.output_file = out->get<std::string>();
  }
  return c;
}

OpCost op_cost(const std::string& name, const TensorList& inputs,
               const std::vector<OutputInfo>& outputs) {
  const auto in = [&](size_t i) -> const Tensor& { return inputs.at(i); };
  if (name == "linear") {  // (x, W (out, in), bias)
    const double macs = static_cast<double>(in(0).numel()) * static_cast<double>(in(1).size(0));
    return {2 * macs, macs};
  }
  if (name == "dense_gelu_dense") {  // (x, W1 (hidden, in), b1, W2 (out, hidden), b2)
    // Counted under c_proj, whose call the op runs in (Note [Fused tensor-parallel MLP]).
    const double rows =
        static_cast<double>(in(0).numel() / std::max<int64_t>(1, in(0).size(in(0).dim() - 1)));
    const double hidden = static_cast<double>(in(1).size(0));
    const double macs = static_cast<double>(in(0).numel()) * hidden +
                        rows * hidden * static_cast<double>(in(3).size(0));
    return {2 * macs + rows * hidden, macs};  // the products and GELU
  }
  if (name == "matmul") {  // (..., M, K) x (..., K, N)
    const double macs =
        static_cast<double>(in(0).numel()) * static_cast<double>(in(1).size(in(1).dim() - 1));
    return {2 * macs, macs};
  }
  if (name == "causal_attention") {  // q, k, v: (B, H, T, D)
    const Tensor &q = in(0), &k = in(1), &v = in(2);
    const double lk = static_cast<double>(k.size(k.dim() - 2));
    const double dv = static_cast<double>(v.size(v.dim() - 1));
    const double rows = static_cast<double>(q.numel() / q.size(q.dim() - 1));
    const double macs = static_cast<double>(q.numel()) * lk + rows * lk * dv;
    return {2 * macs, macs};
  }
  if (name == "softmax" || name == "gelu" || name == "relu") return {numel(outputs.at(0).shape), 0};
  if (name == "layer_norm") {  // (x, weight, bias): 5 per element with a weight
    const bool weight = inputs.size() > 1 && in(1).defined();
    return {numel(outputs.at(0).shape) * (weight ? 5 : 4), 0};
  }
  if (name == "add_layer_norm") {  // (x, delta, weight, bias): the add, then layer_norm's
    const bool weight = inputs.size() > 2 && in(2).defined();
    return {numel(outputs.at(0).shape) * (weight ? 6 : 5), 0};
  }
  if (name == "add" || name == "mul") return {numel(outputs.at(0).shape), 0};
  return {};
}

std::string number_to_string(double v) {
  const double a = std::abs(v);
  const std::pair<double, const char*> units[] = {{1e12, "T"}, {1e9, "G"}, {1e6, "M"},
                                                  {1e3, "K"},  {1, ""},    {1e-3, "m"}};
  for (const auto& [unit, suffix] : units) {
    if (a >= unit) return g2(v / unit) + " " + suffix;
  }
  if (a == 0) return g2(0) + " ";
  return g2(v / 1e-6) + " u";
}

void publish_report(const FlopsProfilerConfig& config, const std::string& report) {
  if (config.output_file.empty()) {
    std::fputs(report.c_str(), stdout);
    std::fflush(stdout);
    return;
  }
  const std::filesystem::path path(config.output_file);
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  std::ofstream out(path, std::ios::trunc);
  out << report;
  out.close();
  TS_CHECK(!ec && !out.fail(), "[flops_profiler] cannot write the report to ", config.output_file,
           ec ? ": " + ec.message() : std::string());
}

FlopsProfiler::FlopsProfiler(const Module& model) : root_(model) {}

void FlopsProfiler::enter(const Module& m) {
  // A module entered again inside its own forward (GPT's untied head inside the model's
  // forward) keeps its outer entry: its time counts once.
  if (depth_[&m]++ == 0) stack_.push_back({&m, now_s()});
}

void FlopsProfiler::exit(const Module& m) noexcept {
  const auto it = depth_.find(&m);
  if (it == depth_.end() || it->second == 0) return;  // entered before installation
  if (--it->second > 0 || stack_.empty() || stack_.back().module != &m) return;
  own_[&m].seconds += now_s() - stack_.back().started;
  stack_.pop_back();
}

void FlopsProfiler::op(const Node& node, const TensorList& inputs) {
  if (stack_.empty()) return;  // outside every module: the loss
  const OpCost cost = op_cost(node.name(), inputs, node.outputs());
  Own& own = own_[stack_.back().module];
  own.flops += cost.flops;
  own.macs += cost.macs;
}

FlopsProfiler::Totals FlopsProfiler::add_totals(const Module& m, TotalsMap& out) const {
  Totals t;
  for (const Tensor& p : m.own_parameters()) t.params += p.numel();
  double children_s = 0;
  for (const auto& [name, child] : m.children()) {
    const Totals c = add_totals(*child, out);
    t.params += c.params;
    t.flops += c.flops;
    t.macs += c.macs;
    children_s += c.seconds;
  }
  const auto it = own_.find(&m);
  if (it != own_.end()) {
    t.flops += it->second.flops;
    t.macs += it->second.macs;
  }
  t.seconds = it != own_.end() && it->second.seconds > 0 ? it->second.seconds : children_s;
  out[&m] = t;
  return t;
}

FlopsProfiler::Totals FlopsProfiler::totals(const Module& m) const {
  TotalsMap all;
  return add_totals(m, all);
}

std::string FlopsProfiler::report(const FlopsProfilerConfig& config,
                                  const ProfileContext& ctx) const {
  const double n = static_cast<double>(std::max<int64_t>(ctx.forwards, 1));
  TotalsMap of;  // every module's, computed once
  const Totals all = add_totals(root_, of);
  const double params = static_cast<double>(all.params);
  const double macs = all.macs / n, flops = all.flops / n, fwd_s = all.seconds / n;
  const double bwd_s = ctx.backward_s / n, step_s = ctx.step_s;
  const double f = 2 + config.recompute_fwd_factor;
  const double mp = static_cast<double>(ctx.model_parallel);
  std::ostringstream out;
  out << "\n-------------------------- DeepSpeed Flops Profiler --------------------------\n"
      << "Profile Summary at step " << ctx.step << ":\n"
      << "Notations:\n"
      << "data parallel size (dp_size), model parallel size(mp_size),\n"
      << "number of parameters (params), number of multiply-accumulate operations(MACs),\n"
      << "number of floating-point operations (flops), floating-point operations per second "
         "(FLOPS),\n"
      << "fwd latency (forward propagation latency), bwd latency (backward propagation "
         "latency),\n"
      << "step (weights update latency), iter latency (sum of fwd, bwd and step latency)\n\n";
  out << line("world size: ", std::to_string(ctx.world))
      << line("data parallel size: ", std::to_string(ctx.data_parallel))
      << line("model parallel size: ", std::to_string(ctx.model_parallel))
      << line("batch size per GPU: ", std::to_string(ctx.micro_batch))
      << line("params per GPU: ", params_to_string(params))
      << line("params of model = params per GPU * mp_size: ", params_to_string(params * mp))
      << line("fwd MACs per GPU: ", number_to_string(macs) + "MACs")
      << line("fwd flops per GPU: ", number_to_string(flops))
      << line("fwd flops of model = fwd flops per GPU * mp_size: ", number_to_string(flops * mp))
      << line("fwd latency: ", number_to_string(fwd_s) + "s")
      << line("fwd FLOPS per GPU = fwd flops per GPU / fwd latency: ",
              number_to_string(fwd_s > 0 ? flops / fwd_s : 0) + "FLOPS");
  if (bwd_s > 0) {
    const double iter_s = fwd_s + bwd_s + step_s;
    out << line("bwd latency: ", number_to_string(bwd_s) + "s")
        << line("bwd FLOPS per GPU = " + g2(f) + " * fwd flops per GPU / bwd latency: ",
                number_to_string(f * flops / bwd_s) + "FLOPS")
        << line("fwd+bwd FLOPS per GPU = " + g2(f + 1) +
                    " * fwd flops per GPU / (fwd+bwd latency): ",
                number_to_string((f + 1) * flops / (fwd_s + bwd_s)) + "FLOPS")
        << line("step latency: ", number_to_string(step_s) + "s")
        << line("iter latency: ", number_to_string(iter_s) + "s")
        << line("FLOPS per GPU = " + g2(f + 1) + " * fwd flops per GPU / iter latency: ",
                number_to_string((f + 1) * flops / iter_s) + "FLOPS")
        << line("samples/second: ", g2(static_cast<double>(ctx.micro_batch * ctx.world) / iter_s));
  }
  if (ctx.analytic_fwd_flops > 0) {
    out << line("fwd flops per GPU by the model's formula (Tessera): ",
                number_to_string(ctx.analytic_fwd_flops))
        << line("counted / formula (Tessera): ", g2(flops / ctx.analytic_fwd_flops));
  }

  // Per depth: each class's params, MACs and latency summed over its modules there.
  std::vector<std::vector<const Module*>> depths;
  std::vector<const Module*> level = {&root_};
  while (!level.empty()) {
    depths.push_back(level);
    std::vector<const Module*> next;
    for (const Module* m : level) {
      for (const auto& [name, child] : m->children()) next.push_back(child);
    }
    level = std::move(next);
  }
  const int64_t shown = config.module_depth >= 0
                            ? std::min<int64_t>(config.module_depth, depths.size())
                            : static_cast<int64_t>(depths.size()) - 1;
  out << "\n----------------------------- Aggregated Profile per GPU "
         "-----------------------------\n"
      << "Top " << config.top_modules
      << " modules in terms of params, MACs or fwd latency at different model depths:\n";
  for (int64_t d = 0; d < shown; ++d) {
    std::map<std::string, Totals> by_class;
    for (const Module* m : depths[d]) {
      const Totals& t = of.at(m);
      Totals& c = by_class[class_name(*m)];
      c.params += t.params;
      c.macs += t.macs / n;
      c.seconds += t.seconds / n;
    }
    const auto top = [&](auto value, auto text) {
      std::vector<std::pair<std::string, Totals>> v(by_class.begin(), by_class.end());
      std::stable_sort(v.begin(), v.end(), [&](const auto& a, const auto& b) {
        return value(a.second) > value(b.second);
      });
      std::string s = "{";
      for (size_t i = 0; i < v.size() && static_cast<int64_t>(i) < config.top_modules; ++i) {
        s += (i ? ", '" : "'") + v[i].first + "': '" + text(value(v[i].second)) + "'";
      }
      return s + "}";
    };
    out << "depth " << d << ":\n"
        << "    params      - "
        << top([](const Totals& t) { return static_cast<double>(t.params); }, params_to_string)
        << "\n    MACs        - "
        << top([](const Totals& t) { return t.macs; },
               [](double v) { return number_to_string(v) + "MACs"; })
        << "\n    fwd latency - "
        << top([](const Totals& t) { return t.seconds; },
               [](double v) { return number_to_string(v) + "s"; })
        << "\n";
  }

  if (config.detailed) {
    out << "\n------------------------------ Detailed Profile per GPU "
           "------------------------------\n"
        << "Each module profile is listed after its name in the following order: \n"
        << "params, percentage of total params, MACs, percentage of total MACs, fwd latency, "
           "percentage of total fwd latency, fwd FLOPS\n\n"
        << "Note: ops outside every module (the loss) are not counted; a module's own ops "
           "(residual sums, attention) make up the difference between its figures and its "
           "children's sum.\n\n";
    const std::function<void(const std::string&, const Module&, int)> tree =
        [&](const std::string& name, const Module& m, int indent) {
          const Totals& t = of.at(&m);
          const std::string pad(static_cast<size_t>(indent) * 2, ' ');
          out << pad << (name.empty() ? "" : "(" + name + "): ") << class_name(m) << "(\n"
              << pad << "  " << params_to_string(static_cast<double>(t.params)) << " = "
              << percent(static_cast<double>(t.params), params) << " Params, "
              << number_to_string(t.macs / n) << "MACs = " << percent(t.macs, all.macs) << " MACs, "
              << number_to_string(t.seconds / n) << "s = " << percent(t.seconds, all.seconds)
              << " latency, " << number_to_string(t.seconds > 0 ? t.flops / t.seconds : 0)
              << "FLOPS\n";
          for (const auto& [child_name, child] : m.children()) tree(child_name, *child, indent + 1);
          out << pad << ")\n";
        };
    tree("", root_, 0);
  }
  out << "------------------------------------------------------------------------------\n";
  return out.str();
}

}  // namespace tessera::train
