// DeepSpeed's csv_monitor file layout (deepspeed/monitor/csv_monitor.py): one CSV file per
// tag, so each curve can be read on its own.
//
// Note [CSV monitor files]
// A tag's file is <dir>/<tag with '/' and ' ' made '_'>.csv (Train/Samples/lr:
// Train_Samples_lr.csv). Its first line is "step,<the tag's last '/' part>" (step,lr), then
// one "<step>,<value>" row per event, each line ended by "\r\n" as Python's csv.writer
// does, the value written as Python's str() of a float writes it (python_float_repr). The
// file is opened, appended to and closed per event, so a killed run keeps every row.
// DeepSpeed appends a second header when a restarted run writes the file again; here a
// resumed run first keeps only the rows up to its checkpoint's step (the rows after it are
// written again) and a fresh run removes the files, as the trainer does with
// metrics.jsonl, so each file has one header and one row per step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::train {

// Python 3's repr() of a double: the shortest digits that read back as the same double,
// in fixed notation with at least one decimal ("65536.0", "0.0001") for decimal exponents
// -4 to 15, else in scientific notation with a signed exponent of two digits or more
// ("1e-05", "1.5e+16"); "inf", "-inf", "nan".
std::string python_float_repr(double value);

class CsvMonitor {
 public:
  // Writes under `dir` (created with its parents). Existing files there of tags starting
  // with `tag_prefix` (whose first line starts with "step,") keep their rows of steps up to
  // `keep_through`, or below it for the tags in `written_before_step` (DeepSpeed writes
  // train_loss at the count before its step); with keep_through < 0 (a fresh run) they are
  // removed (Note [CSV monitor files]). Other files are left alone.
  CsvMonitor(const std::string& dir, const std::string& tag_prefix, int64_t keep_through,
             const std::vector<std::string>& written_before_step = {});

  // Appends the row of `tag` at `step`; throws naming the file when it cannot.
  void write(const std::string& tag, double value, int64_t step);

  // The file name of `tag`'s rows: Train/Samples/lr -> Train_Samples_lr.csv.
  static std::string file_name(const std::string& tag);

 private:
  std::string dir_;
};

}  // namespace tessera::train
