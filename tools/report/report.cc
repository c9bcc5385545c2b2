#include "tools/report/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"

namespace tessera::report {
namespace fs = std::filesystem;
namespace {

// ---- Reading -------------------------------------------------------------------------------

// `line` cut to a length fit for a one-line error message.
std::string excerpt(const std::string& line) {
  constexpr size_t kMax = 40;
  return line.size() <= kMax ? line : line.substr(0, kMax) + "...";
}

// The number `key` of `record`; nullopt when it is absent, null (how nlohmann::json writes a
// NaN) or not finite, so that a failed measurement leaves a gap rather than a zero.
std::optional<double> number(const nlohmann::json& record, const char* key,
                             const std::string& where) {
  const auto it = record.find(key);
  if (it == record.end() || it->is_null()) return std::nullopt;
  TS_CHECK(it->is_number(), "[report] ", where, ": \"", key, "\" expected a number, found ",
           excerpt(it->dump()));
  const double v = it->get<double>();
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

// Appends `key` of `record` at `step` to `series` when it is there.
void add(Series& series, const nlohmann::json& record, const char* key, int64_t step,
         const std::string& where) {
  if (const std::optional<double> v = number(record, key, where)) series.emplace_back(step, *v);
}

// Adds one metrics.jsonl line (`where` is "file:line") to `run`.
void add_record(RunSeries& run, const std::string& line, const std::string& where) {
  const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  TS_CHECK(!record.is_discarded() && record.is_object(), "[report] ", where,
           ": expected a JSON object, found \"", excerpt(line), "\"");
  const auto kind = record.find("kind");
  TS_CHECK(kind != record.end() && kind->is_string(), "[report] ", where,
           ": expected a string \"kind\" (\"train\" or \"eval\"), found ",
           kind == record.end() ? "none" : excerpt(kind->dump()));
  const auto step_it = record.find("step");
  TS_CHECK(step_it != record.end() && step_it->is_number_integer(), "[report] ", where,
           ": expected an integer \"step\", found ",
           step_it == record.end() ? "none" : excerpt(step_it->dump()));
  const int64_t step = step_it->get<int64_t>();
  if (*kind == "train") {
    ++run.train_records;
    add(run.loss, record, "loss", step, where);
    add(run.lr, record, "lr", step, where);
    add(run.grad_norm, record, "grad_norm", step, where);
    add(run.tokens_per_s, record, "tokens_per_s", step, where);
    add(run.mfu, record, "mfu", step, where);
  } else if (*kind == "eval") {
    add(run.val_loss, record, "val_loss", step, where);
  }
  // Other kinds are skipped: a newer trainer's records must not break the report.
}

// ---- Charts --------------------------------------------------------------------------------

// A chart: which series of a run it draws, and how its values are shown.
struct Metric {
  const char* key;    // data-metric
  const char* title;  // <title> and the heading, starting with `key`
  const char* y_axis;
  Series RunSeries::*series;
  double scale;  // value shown = value x scale (mfu as percent)
};

constexpr Metric kMetrics[] = {
    {"loss", "loss (train, and validation dashed)", "loss", &RunSeries::loss, 1.0},
    {"lr", "lr (learning rate)", "learning rate", &RunSeries::lr, 1.0},
    {"grad_norm", "grad_norm (gradient norm)", "gradient norm", &RunSeries::grad_norm, 1.0},
    {"tokens_per_s", "tokens_per_s (throughput)", "tokens / s", &RunSeries::tokens_per_s, 1.0},
    {"mfu", "mfu (model FLOPs utilization)", "MFU (%)", &RunSeries::mfu, 100.0},
};

// Whether `run` has points in the chart of `m` (the loss chart also draws val_loss).
bool has_data(const RunSeries& run, const Metric& m) {
  return !(run.*m.series).empty() || (m.series == &RunSeries::loss && !run.val_loss.empty());
}

// The colour of the run at position `r`.
const char* run_colour(size_t r) { return kPalette[r % std::size(kPalette)]; }

// The geometry of every chart, in SVG pixels: the plot area and the legend column on its
// right (wide enough for a run name of about 30 characters).
constexpr double kWidth = 1080, kLeft = 76, kTop = 40, kPlotWidth = 680, kPlotHeight = 260;
constexpr double kBottom = 52, kLegendRow = 20;

// Maps data coordinates (x0..x1, y0..y1) to the plot area.
struct Frame {
  double x0, x1, y0, y1;
  double x(double v) const { return kLeft + (v - x0) / (x1 - x0) * kPlotWidth; }
  double y(double v) const { return kTop + kPlotHeight - (v - y0) / (y1 - y0) * kPlotHeight; }
};

// A coordinate with one decimal: a tenth of a pixel is invisible, and longer numbers would
// make up most of the page.
std::string coord(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// The SVG path data of `points` (downsampled already).
std::string path_data(const Series& points, const Frame& f) {
  std::string d;
  d.reserve(points.size() * 14);
  for (size_t i = 0; i < points.size(); ++i) {
    d += (i == 0 ? "M" : "L") + coord(f.x(static_cast<double>(points[i].first))) + "," +
         coord(f.y(points[i].second));
  }
  return d;
}

// One run's series path (class "series" or "series val") in `colour`.
std::string series_path(const std::string& run, const Series& points, const Frame& f,
                        const char* colour, bool val) {
  const Series drawn = downsample(points, kMaxPathPoints);
  std::string s =
      str_cat("<path class=\"series", val ? " val" : "", "\" data-run=\"", html_escape(run),
              "\" data-points=\"", drawn.size(), "\" fill=\"none\" stroke=\"", colour,
              val ? "\" stroke-dasharray=\"6 4" : "", "\" d=\"", path_data(drawn, f), "\"/>\n");
  // Markers make sparse evals visible (one eval is a path of one point); past 200 they
  // would only blot the line.
  if (val && drawn.size() <= 200) {
    for (const Point& p : drawn) {
      s += str_cat("<circle class=\"marker\" cx=\"", coord(f.x(static_cast<double>(p.first))),
                   "\" cy=\"", coord(f.y(p.second)), "\" r=\"3.5\" fill=\"", colour,
                   "\" stroke=\"#fff\"/>\n");
    }
  }
  return s;
}

// The grid lines, tick labels and axis titles of `f`.
std::string axes(const Frame& f, const std::vector<double>& xt, const std::vector<double>& yt,
                 const char* y_title) {
  std::string s = str_cat("<rect class=\"plot\" x=\"", kLeft, "\" y=\"", kTop, "\" width=\"",
                          kPlotWidth, "\" height=\"", kPlotHeight, "\"/>\n");
  const std::vector<std::string> xl = tick_labels(xt), yl = tick_labels(yt);
  for (size_t i = 0; i < xt.size(); ++i) {
    const std::string x = coord(f.x(xt[i]));
    s += str_cat("<line class=\"grid\" x1=\"", x, "\" x2=\"", x, "\" y1=\"", kTop, "\" y2=\"",
                 kTop + kPlotHeight, "\"/>\n<text class=\"tick\" x=\"", x, "\" y=\"",
                 kTop + kPlotHeight + 16, "\" text-anchor=\"middle\">", xl[i], "</text>\n");
  }
  for (size_t i = 0; i < yt.size(); ++i) {
    const std::string y = coord(f.y(yt[i]));
    s += str_cat("<line class=\"grid\" x1=\"", kLeft, "\" x2=\"", kLeft + kPlotWidth, "\" y1=\"", y,
                 "\" y2=\"", y, "\"/>\n<text class=\"tick\" x=\"", kLeft - 6, "\" y=\"", y,
                 "\" dy=\"0.32em\" text-anchor=\"end\">", yl[i], "</text>\n");
  }
  s += str_cat("<text class=\"axis-title\" x=\"", kLeft + kPlotWidth / 2, "\" y=\"",
               kTop + kPlotHeight + 40, "\" text-anchor=\"middle\">step</text>\n");
  s += str_cat("<text class=\"axis-title\" transform=\"translate(16,", kTop + kPlotHeight / 2,
               ") rotate(-90)\" text-anchor=\"middle\">", y_title, "</text>\n");
  return s;
}

// Row `row` of a legend: a line sample in `stroke` (with `dash`, SVG attributes) and `label`.
std::string legend_row(int row, const char* stroke, const char* dash, const std::string& label) {
  const double x = kLeft + kPlotWidth + 16, y = kTop + 8 + row * kLegendRow;
  return str_cat("<line x1=\"", x, "\" x2=\"", x + 22, "\" y1=\"", y, "\" y2=\"", y, "\" stroke=\"",
                 stroke, "\" stroke-width=\"3\"", dash, "/><text x=\"", x + 28, "\" y=\"", y,
                 "\" dy=\"0.32em\">", label, "</text>");
}

// The chart of `m` over `runs` (chart_metrics() lists it, so some run has data).
std::string chart(const Metric& m, const std::vector<RunSeries>& runs) {
  const bool loss = m.series == &RunSeries::loss;
  std::vector<Series> train(runs.size()), val(runs.size());
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  for (size_t r = 0; r < runs.size(); ++r) {
    train[r] = runs[r].*m.series;
    for (Point& p : train[r]) p.second *= m.scale;
    if (loss) val[r] = runs[r].val_loss;
    for (const Series* s : {&train[r], &val[r]}) {
      for (const auto& [step, v] : *s) {
        x_lo = std::min(x_lo, static_cast<double>(step));
        x_hi = std::max(x_hi, static_cast<double>(step));
        y_lo = std::min(y_lo, v);
        y_hi = std::max(y_hi, v);
      }
    }
  }
  const std::vector<double> xt = nice_ticks(x_lo, x_hi, 5), yt = nice_ticks(y_lo, y_hi, 5);
  const Frame f{xt.front(), xt.back(), yt.front(), yt.back()};
  int rows = 0;
  for (const RunSeries& run : runs) rows += has_data(run, m) ? 1 : 0;
  const double height =
      std::max(kTop + kPlotHeight + kBottom, kTop + 8 + (rows + (loss ? 3 : 0)) * kLegendRow);
  std::string s = str_cat("<svg class=\"chart\" data-metric=\"", m.key,
                          "\" xmlns=\"http://www.w3.org/2000/svg\" width=\"", kWidth,
                          "\" height=\"", height, "\" viewBox=\"0 0 ", kWidth, " ", height,
                          "\" role=\"img\">\n<title>", m.title, "</title>\n");
  s += str_cat("<text class=\"chart-title\" x=\"", kLeft, "\" y=\"24\">", m.title, "</text>\n");
  s += axes(f, xt, yt, m.y_axis);
  // Every val_loss over every train loss: the noisy train lines would hide them.
  for (const bool is_val : {false, true}) {
    for (size_t r = 0; r < runs.size(); ++r) {
      const Series& points = is_val ? val[r] : train[r];
      if (!points.empty()) s += series_path(runs[r].name, points, f, run_colour(r), is_val);
    }
  }
  int row = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    if (!has_data(runs[r], m)) continue;
    const std::string name = html_escape(runs[r].name);
    s += str_cat("<g class=\"legend-entry\" data-run=\"", name, "\">",
                 legend_row(row++, run_colour(r), "", name), "</g>\n");
  }
  if (loss) {  // which line is which, after a blank row
    s += str_cat("<g class=\"legend-key\">", legend_row(row + 1, "#555", "", "train"),
                 legend_row(row + 2, "#555", " stroke-dasharray=\"6 4\"", "validation"), "</g>\n");
  }
  return s + "</svg>\n";
}

// ---- Page ----------------------------------------------------------------------------------

// The last value of `s` (or with `mean`, the mean) with `decimals` decimals; an en dash for
// an empty series.
std::string number_cell(const Series& s, bool mean, int decimals) {
  if (s.empty()) return "&#8211;";
  double v = s.back().second;
  if (mean) {
    v = 0;
    for (const Point& p : s) v += p.second / static_cast<double>(s.size());
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// The table of runs at the top of the page, each name after a swatch of its colour.
std::string run_table(const std::vector<RunSeries>& runs) {
  std::string s =
      "<table class=\"runs\">\n<tr><th>run</th><th>train steps</th><th>last loss</th>"
      "<th>last val loss</th><th>mean tokens/s</th></tr>\n";
  for (size_t r = 0; r < runs.size(); ++r) {
    const RunSeries& run = runs[r];
    s += str_cat("<tr><td><span class=\"swatch\" style=\"background:", run_colour(r), "\"></span>",
                 html_escape(run.name), "</td><td>", run.train_records, "</td><td>",
                 number_cell(run.loss, false, 4), "</td><td>", number_cell(run.val_loss, false, 4),
                 "</td><td>", number_cell(run.tokens_per_s, true, 0), "</td></tr>\n");
  }
  return s + "</table>\n";
}

constexpr const char* kStyle = R"(body{font-family:sans-serif;margin:24px;color:#222}
h1{font-size:20px;margin:0 0 12px}
table.runs{border-collapse:collapse;margin-bottom:16px;font-size:14px}
table.runs th,table.runs td{padding:4px 12px;border-bottom:1px solid #ddd;text-align:right}
table.runs th:first-child,table.runs td:first-child{text-align:left}
.swatch{display:inline-block;width:12px;height:12px;margin-right:6px;vertical-align:-1px}
svg.chart{display:block;margin:8px 0 20px;font-size:12px}
svg.chart .chart-title{font-size:15px;font-weight:bold} svg.chart .tick{fill:#444;font-size:11px}
svg.chart .plot{fill:none;stroke:#888} svg.chart .grid{stroke:#e4e4e4}
svg.chart .series{stroke-width:1.5;stroke-linejoin:round;stroke-opacity:0.85}
svg.chart .series.val{stroke-width:2.5;stroke-opacity:1}
)";

}  // namespace

RunSeries read_run(const std::string& dir, const std::string& name) {
  const fs::path file = fs::path(dir) / "metrics.jsonl";
  TS_CHECK(fs::is_regular_file(file), "[report] ", file.string(),
           ": no such file; expected a run directory with metrics.jsonl");
  std::ifstream in(file);
  TS_CHECK(in.good(), "[report] ", file.string(), ": cannot be read");
  RunSeries run;
  run.name = name;
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    add_record(run, line, str_cat(file.string(), ":", line_no));
  }
  TS_CHECK(run.train_records > 0, "[report] ", dir,
           ": no train records; expected lines with \"kind\": \"train\" in metrics.jsonl");
  // The trainer writes steps in order; sorting keeps a hand-merged log drawing left to right.
  for (Series* s :
       {&run.loss, &run.val_loss, &run.lr, &run.grad_norm, &run.tokens_per_s, &run.mfu}) {
    std::stable_sort(s->begin(), s->end(),
                     [](const Point& a, const Point& b) { return a.first < b.first; });
  }
  return run;
}

std::vector<std::string> run_names(const std::vector<std::string>& dirs) {
  std::vector<std::string> names;
  std::map<std::string, int> uses;
  for (const std::string& dir : dirs) {
    fs::path p = fs::path(dir).lexically_normal();
    if (!p.has_filename()) p = p.parent_path();  // "a/" -> "a"
    // "." and ".." name the directory they stand for.
    if (p.filename() == "." || p.filename() == "..") p = fs::weakly_canonical(p);
    const std::string name = p.filename().empty() ? dir : p.filename().string();
    names.push_back(name);
    ++uses[name];
  }
  for (size_t i = 0; i < names.size(); ++i) {
    if (uses[names[i]] > 1) names[i] = dirs[i];
  }
  return names;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (lo > hi) std::swap(lo, hi);
  // A range of a few ulps (two runs' rates differing in the last bit) is empty: its step
  // would be too small for the tick counter to move.
  if (hi - lo <= 1e-9 * std::max(std::abs(lo), std::abs(hi))) {
    const double pad = lo == 0 ? 1.0 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(target, 1);
  int k = static_cast<int>(std::floor(std::log10(raw)));
  const double m_raw = raw / std::pow(10.0, k);
  double m = 10;
  for (const double nice : {1.0, 2.0, 2.5, 5.0}) {
    if (nice >= m_raw * (1 - 1e-9)) {
      m = nice;
      break;
    }
  }
  if (m == 10) {
    m = 1;
    ++k;
  }
  // Multiples i x m x 10^k; dividing by an exact power of ten rounds like a decimal literal.
  const auto tick = [&](double i) {
    return k >= 0 ? i * m * std::pow(10.0, k) : i * m / std::pow(10.0, -k);
  };
  const double step = tick(1);
  const double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
  std::vector<double> ticks;
  // At most target + 3 ticks: target intervals, and a partial one at each end.
  for (int64_t n = 0; n <= last - first && n < target + 3; ++n) {
    ticks.push_back(tick(first + static_cast<double>(n)) + 0.0);  // no "-0"
  }
  return ticks;
}

std::vector<std::string> tick_labels(const std::vector<double>& ticks) {
  double big = 0;
  for (const double t : ticks) big = std::max(big, std::abs(t));
  // From 10^4 on ("10k", not "10000"), in thousands, millions or billions.
  struct Unit {
    double from, unit;
    const char* suffix;
  };
  constexpr Unit kUnits[] = {{1e9, 1e9, "G"}, {1e6, 1e6, "M"}, {1e4, 1e3, "k"}, {0, 1, ""}};
  const Unit* u = kUnits;
  while (big < u->from) ++u;
  const double unit = u->unit;
  const char* suffix = u->suffix;
  const double step = ticks.size() > 1 ? (ticks[1] - ticks[0]) / unit : 1;
  // The fewest decimals that write the step exactly (2.5 -> 1, 0.05 -> 2).
  int decimals = 0;
  while (decimals < 12) {
    const double scaled = step * std::pow(10.0, decimals);
    if (std::abs(scaled - std::round(scaled)) <= 1e-6 * scaled) break;
    ++decimals;
  }
  std::vector<std::string> labels;
  for (const double t : ticks) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f%s", decimals, t / unit + 0.0, suffix);
    labels.push_back(buf);
  }
  return labels;
}

Series downsample(const Series& points, size_t max_points) {
  max_points = std::max<size_t>(max_points, 2);
  if (points.size() <= max_points) return points;
  const size_t inner = points.size() - 2, buckets = (max_points - 2) / 2;
  Series out = {points.front()};
  for (size_t b = 0; b < buckets; ++b) {
    const size_t begin = 1 + inner * b / buckets, end = 1 + inner * (b + 1) / buckets;
    if (begin == end) continue;
    size_t lo = begin, hi = begin;
    for (size_t i = begin; i < end; ++i) {
      if (points[i].second < points[lo].second) lo = i;
      if (points[i].second > points[hi].second) hi = i;
    }
    out.push_back(points[std::min(lo, hi)]);
    if (lo != hi) out.push_back(points[std::max(lo, hi)]);
  }
  out.push_back(points.back());
  return out;
}

std::vector<std::string> chart_metrics(const std::vector<RunSeries>& runs) {
  std::vector<std::string> keys;
  for (const Metric& m : kMetrics) {
    if (std::any_of(runs.begin(), runs.end(), [&](const RunSeries& r) { return has_data(r, m); }))
      keys.push_back(m.key);
  }
  return keys;
}

std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const char* ref = c == '&'    ? "&amp;"
                      : c == '<'  ? "&lt;"
                      : c == '>'  ? "&gt;"
                      : c == '"'  ? "&quot;"
                      : c == '\'' ? "&#39;"
                                  : nullptr;
    if (ref != nullptr) {
      out += ref;
    } else {
      out += c;
    }
  }
  return out;
}

std::string render_html(const std::vector<RunSeries>& runs) {
  std::string names;
  for (const RunSeries& run : runs) names += (names.empty() ? "" : ", ") + html_escape(run.name);
  std::string page = str_cat(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
      "<title>Training report: ", names, "</title>\n<style>\n", kStyle,
      "</style>\n</head>\n<body>\n<h1>Training report: ", names, "</h1>\n", run_table(runs));
  for (const std::string& key : chart_metrics(runs)) {
    for (const Metric& m : kMetrics) {
      if (key == m.key) page += chart(m, runs);
    }
  }
  return page + "</body>\n</html>\n";
}

}  // namespace tessera::report
