// The training report: one self-contained HTML page with plots of a run's metrics, or of
// several runs' side by side, read from their metrics.jsonl (tools/trainer/metrics.h).
//
//   std::vector<std::string> dirs = {".runs/a", ".runs/b"};
//   std::vector<std::string> names = run_names(dirs);
//   std::vector<RunSeries> runs = {read_run(dirs[0], names[0]), read_run(dirs[1], names[1])};
//   std::string page = render_html(runs);
//
// The plots are inline SVG; the page loads no script, font, style sheet or image, so it opens
// offline and can be mailed or archived as one file.
//
// Note [Report markup]
// The page is read by tests (tests/tools/report) as well as people, so its markup is a
// contract:
//   - one `<svg class="chart" data-metric="M">` per metric M that some run has, in the order
//     loss, lr, grad_norm, tokens_per_s, mfu, each with a `<title>` child starting with M;
//   - per run with data in a chart, `<path class="series" data-run="RUN" data-points="N">`,
//     N the points drawn (at most kMaxPathPoints), and in the loss chart, per run with eval
//     records, `<path class="series val" ...>` (dashed) with the same attributes;
//   - per run with data in a chart, `<g class="legend-entry" data-run="RUN">`;
//   - axis tick labels as `<text class="tick">`.
// Each run keeps one colour (kPalette, by its position, cycling) in every chart.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tessera::report {

// One sample of a metric: (step, value).
using Point = std::pair<int64_t, double>;
// A metric's samples in step order.
using Series = std::vector<Point>;

// What the report shows of one run. A record's missing, null or non-finite field adds no
// point (it is absent, not zero).
struct RunSeries {
  std::string name;  // shown in the header and legends, and as data-run
  Series loss;       // train records' "loss"
  Series val_loss;   // eval records' "val_loss"
  Series lr;
  Series grad_norm;
  Series tokens_per_s;
  Series mfu;                 // as written: a fraction of the peak (the chart shows percent)
  int64_t train_records = 0;  // train records, with or without fields
};

// The series of `dir`/metrics.jsonl, named `name`. Fields other than the ones above are
// ignored, and so are records of a kind other than "train" and "eval". Throws tessera::Error
// naming the file (and line) when the file is missing, a line is not a JSON object, a record
// has no integer "step" or string "kind", a known field is neither a number nor null, or there
// are no train records.
RunSeries read_run(const std::string& dir, const std::string& name);

// The runs' names for run directories given as `dirs`: each directory's last component
// (".runs/a/" -> "a"); directories that would share a name are named by their path as given.
std::vector<std::string> run_names(const std::vector<std::string>& dirs);

// Axis ticks covering [lo, hi]: multiples of a "nice" step (1, 2, 2.5 or 5 x 10^k), the
// smallest one giving at most `target` intervals over [lo, hi], from the last multiple at or
// below lo to the first at or above hi. An empty range (lo == hi) is widened by 10% of |lo|
// (by 1 when lo is 0) on each side. Ticks are exact decimals ((i x m) / 10^-k), so 0.3 is the
// double 0.3, not 3 x 0.1.
std::vector<double> nice_ticks(double lo, double hi, int target);

// Labels for `ticks` (from nice_ticks), with as many decimals as their step needs, all alike
// ("0.0", "2.5", "5.0"); an axis reaching 10^4 or more is written in k, M or G ("45k").
std::vector<std::string> tick_labels(const std::vector<double>& ticks);

// The most points one series' path is drawn with; longer series are downsampled.
inline constexpr size_t kMaxPathPoints = 1000;

// At most `max_points` (at least 2) of `points`: all of them when they fit, else the first,
// the last, and between them the lowest and the highest point of each of (max_points - 2) / 2
// equal buckets, in step order, so spikes and the range survive (every k-th point would
// drop them).
Series downsample(const Series& points, size_t max_points);

// The colours of the runs, by position, cycling: distinguishable on white and in print.
inline constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                           "#9467bd", "#8c564b", "#e377c2", "#17becf"};

// The metrics `runs` have a chart for, in page order (a subset of loss, lr, grad_norm,
// tokens_per_s, mfu; loss when any run has train loss or val_loss).
std::vector<std::string> chart_metrics(const std::vector<RunSeries>& runs);

// `text` with &, <, >, " and ' as character references, for HTML text and attributes.
std::string html_escape(const std::string& text);

// The HTML5 page of `runs` (Note [Report markup]): a title, a table of the runs (train
// records, last loss, last val loss, mean tokens/s) and one chart per chart_metrics().
std::string render_html(const std::vector<RunSeries>& runs);

}  // namespace tessera::report
