// The training report (tools/report/report.h): nice axis ticks and their labels (the
// expected values worked out by hand), downsampling that keeps the ends and the extremes,
// metrics.jsonl read into series (missing and NaN fields absent, unknown ones ignored), the
// page's markup contract (Note [Report markup]) and the one-line errors.
#include "tools/report/report.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "tests/test_files.h"
#include "tests/testing.h"

namespace tessera::report {
namespace {

// Occurrences of `needle` in `text`.
size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// A run directory `name` under a fresh temporary directory, holding `jsonl` as metrics.jsonl.
std::filesystem::path run_dir(const std::string& name, const std::string& jsonl) {
  const std::filesystem::path dir = testing::fresh_dir("report_" + name) / name;
  std::filesystem::create_directories(dir);
  testing::write_bytes(dir / "metrics.jsonl", jsonl);
  return dir;
}

// A synthetic run of `steps` steps: a decaying loss, a warmup-then-constant lr, and with
// `mfu` an mfu series; an eval every 50 steps.
RunSeries synthetic_run(const std::string& name, int64_t steps, bool mfu) {
  RunSeries run;
  run.name = name;
  run.train_records = steps;
  for (int64_t s = 1; s <= steps; ++s) {
    const double x = static_cast<double>(s);
    run.loss.emplace_back(s, 1.5 + 3.0 / std::sqrt(x) + 0.05 * std::sin(x));
    run.lr.emplace_back(s, 1e-3 * std::min(1.0, x / 100));
    run.grad_norm.emplace_back(s, 1.0 + 0.5 * std::cos(x / 7));
    run.tokens_per_s.emplace_back(s, 40000 + 1000 * std::sin(x / 13));
    if (mfu) run.mfu.emplace_back(s, 0.4 + 0.01 * std::sin(x / 5));
    if (s % 50 == 0) run.val_loss.emplace_back(s, 1.6 + 3.0 / std::sqrt(x));
  }
  return run;
}

TEST_CASE("nice ticks cover the range with 1, 2, 2.5 or 5 x 10^k steps", "[report]") {
  using V = std::vector<double>;
  // (hi - lo) / 5 and the smallest nice step at or above it:
  CHECK(nice_ticks(0, 10, 5) == V{0, 2, 4, 6, 8, 10});  // 2 -> 2
  // A range of a few ulps is an empty one, widened (not a step too small to count with).
  CHECK(nice_ticks(1e-3, std::nextafter(std::nextafter(1e-3, 1.0), 1.0), 5).size() <= 8);
  CHECK(nice_ticks(1, 2000, 5) == V{0, 500, 1000, 1500, 2000});                     // 399.8 -> 500
  CHECK(nice_ticks(1.6, 4.2, 5) == V{1, 2, 3, 4, 5});                               // 0.52 -> 1
  CHECK(nice_ticks(0.25, 0.44, 5) == V{0.25, 0.3, 0.35, 0.4, 0.45});                // 0.038 -> 0.05
  CHECK(nice_ticks(0, 12, 5) == V{0, 2.5, 5, 7.5, 10, 12.5});                       // 2.4 -> 2.5
  CHECK(nice_ticks(-3, 17, 5) == V{-5, 0, 5, 10, 15, 20});                          // 4 -> 5
  CHECK(nice_ticks(2e-5, 1e-3, 5) == V{0, 0.0002, 0.0004, 0.0006, 0.0008, 0.001});  // 1.96e-4
  CHECK(nice_ticks(20000, 50000, 5) == V{20000, 30000, 40000, 50000});              // 6000 -> 10^4
  CHECK(nice_ticks(50000, 20000, 5) == V{20000, 30000, 40000, 50000});              // reversed
  // An empty range widened by 10% (0.7; 0.28 -> 0.5), or by 1 around 0 (0.4 -> 0.5).
  CHECK(nice_ticks(7, 7, 5) == V{6, 6.5, 7, 7.5, 8});
  CHECK(nice_ticks(0, 0, 5) == V{-1, -0.5, 0, 0.5, 1});
}

TEST_CASE("tick labels have the decimals of their step, large ones in k and M", "[report]") {
  using S = std::vector<std::string>;
  CHECK(tick_labels({0, 500, 1000, 1500, 2000}) == S{"0", "500", "1000", "1500", "2000"});
  CHECK(tick_labels({0, 2.5, 5, 7.5, 10}) == S{"0.0", "2.5", "5.0", "7.5", "10.0"});
  CHECK(tick_labels({0.25, 0.3, 0.35}) == S{"0.25", "0.30", "0.35"});
  CHECK(tick_labels({0, 0.0002, 0.0004}) == S{"0.0000", "0.0002", "0.0004"});
  CHECK(tick_labels({-1, -0.5, 0, 0.5, 1}) == S{"-1.0", "-0.5", "0.0", "0.5", "1.0"});
  CHECK(tick_labels({20000, 30000, 40000}) == S{"20k", "30k", "40k"});
  CHECK(tick_labels({0, 500000, 1000000, 1500000}) == S{"0.0M", "0.5M", "1.0M", "1.5M"});
  CHECK(tick_labels({5000, 7500, 10000}) == S{"5.0k", "7.5k", "10.0k"});
}

TEST_CASE("downsampling keeps the ends and each bucket's extremes, within the cap", "[report]") {
  Series s;
  for (int64_t i = 0; i < 2000; ++i) s.emplace_back(i * 10, static_cast<double>(i * 37 % 101));
  s[777].second = 1000;  // a spike
  s[1234].second = -1000;
  SECTION("a short series is kept whole") {
    const Series head(s.begin(), s.begin() + 1000);
    CHECK(downsample(head, 1000) == head);
  }
  SECTION("a long one is capped") {
    const Series d = downsample(s, 1000);
    // 1 + 499 buckets of 4 points, each with a distinct lowest and highest, + 1.
    CHECK(d.size() == 1000);
    CHECK(d.front() == s.front());
    CHECK(d.back() == s.back());
    for (size_t i = 1; i < d.size(); ++i) CHECK(d[i - 1].first < d[i].first);
    CHECK(std::count(d.begin(), d.end(), s[777]) == 1);
    CHECK(std::count(d.begin(), d.end(), s[1234]) == 1);
    CHECK(downsample(s, 101).size() <= 101);
  }
  SECTION("fewer than 4 points allowed: the ends only") {
    CHECK(downsample(s, 3) == Series{s.front(), s.back()});
    CHECK(downsample(s, 0) == Series{s.front(), s.back()});
  }
}

TEST_CASE("read_run: train and eval series, absent fields left out", "[report]") {
  // NaN as the trainer's writer (nlohmann::json) writes it: null.
  const std::string nan_loss = nlohmann::json{
      {"kind", "train"},
      {"step", 2},
      {"loss", NAN},
      {"lr", 0.002},
      {"grad_norm", 1.5}}.dump();
  const std::filesystem::path dir = run_dir(
      "read",
      "{\"comm_bytes\":0,\"elapsed_s\":0.6,\"grad_norm\":2.5,\"kind\":\"train\",\"loss\":4.0,"
      "\"lr\":0.001,\"mfu\":0.25,\"step\":1,\"tokens_per_s\":1000.0,\"moe\":[{\"block\":0}]}\n" +
          nan_loss + "\n" +
          "{\"elapsed_s\":1.0,\"kind\":\"eval\",\"step\":2,\"val_loss\":3.5}\n"
          "\n"
          "{\"kind\":\"checkpoint\",\"step\":2}\n"
          "{\"kind\":\"train\",\"step\":3,\"loss\":3.0,\"lr\":0.003,\"tokens_per_s\":2000}\n");
  const RunSeries run = read_run(dir.string(), "read");
  CHECK(run.name == "read");
  CHECK(run.train_records == 3);
  CHECK(run.loss == Series{{1, 4.0}, {3, 3.0}});
  CHECK(run.val_loss == Series{{2, 3.5}});
  CHECK(run.lr == Series{{1, 0.001}, {2, 0.002}, {3, 0.003}});
  CHECK(run.grad_norm == Series{{1, 2.5}, {2, 1.5}});
  CHECK(run.tokens_per_s == Series{{1, 1000.0}, {3, 2000.0}});
  CHECK(run.mfu == Series{{1, 0.25}});
}

TEST_CASE("run names: the last component, the path where two would share it", "[report]") {
  CHECK(run_names({".runs/a", "x/b/", "y/a", "c"}) ==
        std::vector<std::string>{".runs/a", "b", "y/a", "c"});
  CHECK(run_names({"."}) ==
        std::vector<std::string>{std::filesystem::current_path().filename().string()});
}

TEST_CASE("the page: one chart per metric, every run's series and legend entry", "[report]") {
  const std::vector<RunSeries> runs = {synthetic_run("short", 300, true),
                                       synthetic_run("long", 1500, true)};
  const std::string page = render_html(runs);
  CHECK(page.rfind("<!DOCTYPE html>", 0) == 0);
  CHECK(chart_metrics(runs) ==
        std::vector<std::string>{"loss", "lr", "grad_norm", "tokens_per_s", "mfu"});
  size_t previous = 0;
  for (const std::string metric : {"loss", "lr", "grad_norm", "tokens_per_s", "mfu"}) {
    INFO(metric);
    const std::string svg = "<svg class=\"chart\" data-metric=\"" + metric + "\"";
    CHECK(count(page, svg) == 1);
    CHECK(page.find(svg) > previous);  // in page order
    previous = page.find(svg);
    CHECK(page.find("<title>" + metric, previous) < page.find("</svg>", previous));
  }
  CHECK(count(page, "<svg class=\"chart\"") == 5);
  // The short run is drawn whole; the long one's series at most kMaxPathPoints each.
  CHECK(count(page, "<path class=\"series\" data-run=\"short\" data-points=\"300\"") == 5);
  const Series* long_series[] = {&runs[1].loss, &runs[1].lr, &runs[1].grad_norm,
                                 &runs[1].tokens_per_s, &runs[1].mfu};
  for (const Series* s : long_series) {
    const size_t n = downsample(*s, kMaxPathPoints).size();
    CHECK(n <= kMaxPathPoints);
    CHECK(page.find("<path class=\"series\" data-run=\"long\" data-points=\"" + std::to_string(n) +
                    "\"") != std::string::npos);
  }
  CHECK(count(page, "<path class=\"series\" data-run=\"long\"") == 5);
  CHECK(count(page, "<path class=\"series val\" data-run=\"short\" data-points=\"6\"") == 1);
  CHECK(count(page, "<path class=\"series val\" data-run=\"long\" data-points=\"30\"") == 1);
  CHECK(count(page, "<g class=\"legend-entry\" data-run=\"short\"") == 5);
  CHECK(count(page, "<g class=\"legend-entry\" data-run=\"long\"") == 5);
  CHECK(count(page, "<text class=\"tick\"") >= 5 * 8);
  // Nothing from the network: the only URL is the SVG namespace, which loads nothing.
  std::string offline = page;
  const std::string xmlns = "xmlns=\"http://www.w3.org/2000/svg\"";
  for (size_t at; (at = offline.find(xmlns)) != std::string::npos;) offline.erase(at, xmlns.size());
  CHECK(offline.find("http") == std::string::npos);
  CHECK(offline.find("<script") == std::string::npos);
  CHECK(offline.find("url(") == std::string::npos);
}

TEST_CASE("the page leaves out charts no run has data for, and escapes names", "[report]") {
  RunSeries run = synthetic_run("<b>&\"x'", 120, /*mfu=*/false);
  run.grad_norm.clear();
  const std::vector<RunSeries> runs = {run};
  CHECK(chart_metrics(runs) == std::vector<std::string>{"loss", "lr", "tokens_per_s"});
  const std::string page = render_html(runs);
  CHECK(count(page, "<svg class=\"chart\"") == 3);
  CHECK(page.find("data-metric=\"mfu\"") == std::string::npos);
  CHECK(page.find("data-metric=\"grad_norm\"") == std::string::npos);
  CHECK(count(page, "data-run=\"&lt;b&gt;&amp;&quot;x&#39;\"") == 3 + 3 + 1);  // paths, legend
  CHECK(page.find("<b>&") == std::string::npos);
}

TEST_CASE("read_run errors name the file, the line, what was expected and found", "[report]") {
  const std::filesystem::path missing = testing::fresh_dir("report_missing") / "nope";
  CHECK(testing::error_of([&] { read_run(missing.string(), "nope"); }) ==
        "[report] " + missing.string() +
            "/metrics.jsonl: no such file; expected a run directory with metrics.jsonl");

  const std::string train = "{\"kind\":\"train\",\"step\":1,\"loss\":2.0}\n";
  const auto error_for = [&](const std::string& name, const std::string& jsonl) {
    const std::filesystem::path dir = run_dir(name, jsonl);
    return std::make_pair(testing::error_of([&] { read_run(dir.string(), name); }),
                          (dir / "metrics.jsonl").string());
  };
  {
    const auto [message, file] = error_for("bad_line", train + "not json\n");
    CHECK(message == "[report] " + file + ":2: expected a JSON object, found \"not json\"");
  }
  {
    const auto [message, file] = error_for("array", train + train + "[1,2]\n");
    CHECK(message == "[report] " + file + ":3: expected a JSON object, found \"[1,2]\"");
  }
  {
    const auto [message, file] = error_for("no_step", "{\"kind\":\"train\",\"loss\":1}\n");
    CHECK(message == "[report] " + file + ":1: expected an integer \"step\", found none");
  }
  {
    const auto [message, file] = error_for("no_kind", "{\"step\":1,\"loss\":1}\n");
    CHECK(message == "[report] " + file +
                         ":1: expected a string \"kind\" (\"train\" or \"eval\"), found none");
  }
  {
    const auto [message, file] =
        error_for("string_loss", "{\"kind\":\"train\",\"step\":1,\"loss\":\"high\"}\n");
    CHECK(message == "[report] " + file + ":1: \"loss\" expected a number, found \"high\"");
  }
  const std::filesystem::path evals =
      run_dir("evals_only", "{\"kind\":\"eval\",\"step\":5,\"val_loss\":2.0}\n");
  CHECK(testing::error_of([&] { read_run(evals.string(), "evals_only"); }) ==
        "[report] " + evals.string() +
            ": no train records; expected lines with \"kind\": \"train\" in metrics.jsonl");
}

}  // namespace
}  // namespace tessera::report
