// Where one training step's time goes: the self time of every module's forward and of every
// autograd node's gradient function, timed on a device's compute stream (CUDA events) or on
// the host clock, summed over the calls with the same label.
//
// Note [Step profile]
// A StepProfile is a ForwardObserver and a BackwardObserver (Notes [Forward observers] and
// [Backward observers]). Each module forward and each node's gradient function is a span
// between two marks of its clock; spans nest (a Block's forward holds its Linears'), and a
// span's self time is its length less its direct children's. Every span lies in a phase
// the caller opens ("forward", "backward", ...), whose time outside any span is the row
// "(outside)": for the forward, the loss and the work of modules that open no scope; for the
// backward, the zeros the engine makes for outputs without a gradient and the work of
// the optimizer's backward outside autograd (its reductions). The
// rows' times add up to the phases' lengths. Device marks are CUDA events on the stream
// every kernel runs on, so a span is the device time of the work queued inside it, with
// the gaps where the device waited for the host counted in. Forward labels are the
// module's name in the model with layer indices as '*' ("h.*.attn.c_attn") and its class;
// backward labels are the node's op name and the module whose forward recorded it
// ("linear in h.*.attn.c_attn (Linear)"), or the op name alone for nodes recorded outside
// every module (the loss) or not by an op (a leaf's AccumulateGrad).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/backward_observer.h"
#include "autograd/forward_observer.h"
#include "autograd/module.h"

namespace tessera::bench {

// Points in time, read back after the step.
class MarkClock {
 public:
  virtual ~MarkClock() = default;
  // A point now (on a device: once the work queued so far has run); returns its index.
  virtual size_t mark() = 0;
  // Milliseconds from the first mark to each mark (waits for the device).
  virtual std::vector<double> read() = 0;
};

// CUDA events on the compute stream of CUDA device `device`.
std::unique_ptr<MarkClock> device_clock(int device);

struct ProfileRow {
  std::string phase;
  std::string label;
  int64_t calls = 0;
  double ms = 0;  // self time summed over the calls
};

class StepProfile : public ForwardObserver, public BackwardObserver {
 public:
  // `model` names the modules whose forwards are seen.
  StepProfile(MarkClock& clock, const Module& model);

  // Opens and closes a phase; spans outside a phase are refused.
  void begin_phase(const std::string& name);
  void end_phase();
  // Runs `fn` as phase `name`, with this profile observing its forwards and backwards.
  void phase(const std::string& name, const std::function<void()>& fn);

  void enter(const Module& m) override;
  void exit(const Module& m) noexcept override;
  void op(const Node& node, const TensorList& inputs) override;
  void begin(const Node& node) override;
  void end(const Node& node) noexcept override;

  // Self time by (phase, label), phases in order and each one's rows by time, largest first.
  std::vector<ProfileRow> rows();

 private:
  struct Span {
    size_t phase;
    std::string label;
    size_t start, end = 0;  // marks
    int parent;             // span index; -1 for a phase
  };
  void open(std::string label);
  void close() noexcept;

  MarkClock& clock_;
  std::map<const Module*, std::string> names_;
  std::vector<std::string> phases_;
  std::vector<Span> spans_;
  std::vector<int> open_;                              // indices of the open spans, innermost last
  std::vector<const std::string*> modules_;            // labels of the open module forwards
  std::map<const Node*, const std::string*> made_in_;  // each recorded node's module label
  bool clock_failed_ = false;
};

}  // namespace tessera::bench
