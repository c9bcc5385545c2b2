// The profile of Note [Step profile].
#include "tools/bench/step_profile.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <utility>

#include "core/cuda_runtime.h"
#include "core/error.h"

namespace tessera::bench {
namespace {

class DeviceClock final : public MarkClock {
 public:
  explicit DeviceClock(int device) : device_(device) {}
  size_t mark() override {
    auto event = std::make_unique<cuda::Event>(device_);
    event->record();
    events_.push_back(std::move(event));
    return events_.size() - 1;
  }
  std::vector<double> read() override {
    std::vector<double> ms;
    if (events_.empty()) return ms;
    events_.back()->synchronize();
    for (const auto& e : events_) ms.push_back(cuda::Event::elapsed_ms(*events_.front(), *e));
    return ms;
  }

 private:
  int device_;
  std::vector<std::unique_ptr<cuda::Event>> events_;
};

// "transformer.h.3.attn.c_attn" -> "transformer.h.*.attn.c_attn".
std::string without_indices(const std::string& name) {
  std::string out, part;
  auto flush = [&] {
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](unsigned char c) {
      return std::isdigit(c) != 0;
    });
    out += (out.empty() ? "" : ".") + (digits ? std::string("*") : part);
    part.clear();
  };
  for (char c : name) {
    if (c == '.') {
      flush();
    } else {
      part += c;
    }
  }
  flush();
  return out;
}

}  // namespace

std::unique_ptr<MarkClock> device_clock(int device) {
  return std::make_unique<DeviceClock>(device);
}

StepProfile::StepProfile(MarkClock& clock, const Module& model) : clock_(clock) {
  const std::function<void(const Module&, const std::string&)> walk = [&](const Module& m,
                                                                          const std::string& name) {
    names_[&m] = (name.empty() ? "" : without_indices(name) + " ") + "(" + class_name(m) + ")";
    for (const auto& [child_name, child] : m.children()) {
      walk(*child, name.empty() ? child_name : name + "." + child_name);
    }
  };
  walk(model, "");
}

void StepProfile::begin_phase(const std::string& name) {
  TS_CHECK(open_.empty(), "[StepProfile] phase '", name, "' opened inside another phase");
  phases_.push_back(name);
  open("(outside)");
}

void StepProfile::end_phase() {
  TS_CHECK(open_.size() == 1, "[StepProfile] expected one open phase to close, found ",
           open_.size(), " open spans");
  close();
}

void StepProfile::phase(const std::string& name, const std::function<void()>& fn) {
  begin_phase(name);
  {
    const ForwardObserverGuard forwards(*this);
    const BackwardObserverGuard backwards(*this);
    fn();
  }
  end_phase();
}

void StepProfile::open(std::string label) {
  TS_CHECK(!phases_.empty() && (!open_.empty() || label == "(outside)"), "[StepProfile] a span ('",
           label, "') outside any phase");
  const int parent = open_.empty() ? -1 : open_.back();
  spans_.push_back({phases_.size() - 1, std::move(label), clock_.mark(), 0, parent});
  open_.push_back(static_cast<int>(spans_.size()) - 1);
}

void StepProfile::close() noexcept {
  if (open_.empty()) return;
  try {
    spans_[open_.back()].end = clock_.mark();
  } catch (...) {
    clock_failed_ = true;
  }
  open_.pop_back();
}

void StepProfile::enter(const Module& m) {
  auto it = names_.find(&m);
  if (it == names_.end()) it = names_.emplace(&m, "(" + class_name(m) + ")").first;
  open(it->second);
  modules_.push_back(&it->second);
}

void StepProfile::exit(const Module&) noexcept {
  close();
  if (!modules_.empty()) modules_.pop_back();
}

void StepProfile::op(const Node& node, const TensorList&) {
  if (!modules_.empty()) made_in_[&node] = modules_.back();
}

void StepProfile::begin(const Node& node) {
  const auto it = made_in_.find(&node);
  open(it == made_in_.end() ? node.name() : node.name() + " in " + *it->second);
}

void StepProfile::end(const Node&) noexcept { close(); }

std::vector<ProfileRow> StepProfile::rows() {
  TS_CHECK(!clock_failed_, "[StepProfile] a mark failed while a span closed");
  TS_CHECK(open_.empty(), "[StepProfile] ", open_.size(), " spans are still open");
  const std::vector<double> at = clock_.read();
  std::vector<double> self(spans_.size());
  for (size_t i = 0; i < spans_.size(); ++i) self[i] = at[spans_[i].end] - at[spans_[i].start];
  for (const Span& s : spans_) {
    if (s.parent >= 0) self[s.parent] -= at[s.end] - at[s.start];
  }
  std::vector<ProfileRow> rows;
  for (size_t p = 0; p < phases_.size(); ++p) {
    std::map<std::string, ProfileRow> by_label;
    for (size_t i = 0; i < spans_.size(); ++i) {
      if (spans_[i].phase != p) continue;
      ProfileRow& row = by_label[spans_[i].label];
      row.phase = phases_[p];
      row.label = spans_[i].label;
      row.calls += 1;
      row.ms += self[i];
    }
    std::vector<ProfileRow> phase_rows;
    for (auto& [label, row] : by_label) phase_rows.push_back(std::move(row));
    std::stable_sort(phase_rows.begin(), phase_rows.end(),
                     [](const ProfileRow& a, const ProfileRow& b) { return a.ms > b.ms; });
    rows.insert(rows.end(), phase_rows.begin(), phase_rows.end());
  }
  return rows;
}

}  // namespace tessera::bench
