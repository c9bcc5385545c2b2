// DeepSpeed's pipeline schedules (deepspeed/runtime/pipe/schedule.py) without communication:
// the (S=2, M=3) listing produced by DeepSpeed's own schedule.py, the (4, 4) facts, and for
// every S <= 8 and M <= 16 a simulation of all stages with blocking point-to-point that
// checks pairing, deadlock freedom, buffer safety and the work each stage does.
#include "parallel/pipeline/schedule.h"

#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace tessera::parallel::pipeline {
namespace {

// "0:[Load(0),Fwd(0)] 1:[SendAct(0)] ..." as the reference document lists a schedule.
std::string listing(const std::vector<PipeStep>& steps) {
  std::ostringstream s;
  for (size_t k = 0; k < steps.size(); ++k) {
    if (k > 0) s << " ";
    s << k << ":[";
    for (size_t i = 0; i < steps[k].size(); ++i) s << (i ? "," : "") << to_string(steps[k][i]);
    s << "]";
  }
  return s.str();
}

TEST_CASE("train schedule (S=2, M=3) equals DeepSpeed's listing", "[pipeline]") {
  CHECK(train_buffers(3, 2, 0) == 2);
  CHECK(train_buffers(3, 2, 1) == 2);
  CHECK(listing(train_schedule(3, 2, 0)) ==
        "0:[Load(0),Fwd(0)] 1:[SendAct(0)] 2:[Load(1),Fwd(1)] 3:[RecvGrad(0),SendAct(1),Bwd(0)] "
        "4:[Load(0),Fwd(0)] 5:[RecvGrad(1),SendAct(0),Bwd(1)] 6:[] "
        "7:[RecvGrad(0),Bwd(0),ReduceTied,ReduceGrads,OptStep]");
  CHECK(listing(train_schedule(3, 2, 1)) ==
        "0:[] 1:[RecvAct(0),Load(0),Fwd(0)] 2:[Bwd(0)] 3:[SendGrad(0),RecvAct(1),Load(1),Fwd(1)] "
        "4:[Bwd(1)] 5:[SendGrad(1),RecvAct(0),Load(0),Fwd(0)] 6:[Bwd(0)] "
        "7:[SendGrad(0),ReduceTied,ReduceGrads,OptStep]");
}

// Steps of `stage` that run op.
std::vector<int> steps_with(const std::vector<PipeStep>& steps, PipeOp op) {
  std::vector<int> out;
  for (size_t k = 0; k < steps.size(); ++k) {
    for (const PipeInstruction& in : steps[k]) {
      if (in.op == op) out.push_back(static_cast<int>(k));
    }
  }
  return out;
}

TEST_CASE("train schedule (S=4, M=4): buffers and step placement", "[pipeline]") {
  CHECK(train_buffers(4, 4, 0) == 4);
  CHECK(train_buffers(4, 4, 1) == 3);
  CHECK(train_buffers(4, 4, 2) == 2);
  CHECK(train_buffers(4, 4, 3) == 2);
  const std::vector<PipeStep> s0 = train_schedule(4, 4, 0);
  CHECK(s0.size() == 14);
  CHECK(steps_with(s0, PipeOp::forward) == std::vector<int>{0, 2, 4, 6});
  CHECK(steps_with(s0, PipeOp::backward) == std::vector<int>{7, 9, 11, 13});
  const std::vector<PipeStep> s3 = train_schedule(4, 4, 3);
  CHECK(steps_with(s3, PipeOp::forward) == std::vector<int>{3, 5, 7, 9});
  CHECK(steps_with(s3, PipeOp::backward) == std::vector<int>{4, 6, 8, 10});
}

TEST_CASE("schedules reject impossible shapes", "[pipeline]") {
  CHECK_THROWS_WITH(train_schedule(0, 2, 0),
                    Catch::Contains("[pipeline] train schedule: expected micro-batches >= 1, "
                                    "stages >= 1 and 0 <= stage < stages, found 0 micro-batches, "
                                    "2 stages, stage 0"));
  CHECK_THROWS_WITH(inference_schedule(2, 2, 2), Catch::Contains("stage 2"));
}

// Runs every stage's instruction list in order, as executors with blocking sends and
// receives would: a send completes only together with the matching receive on the peer.
// Checks every rule a correct executor relies on and returns the problems found.
class Simulation {
 public:
  Simulation(int micro_batches, int stages, bool training)
      : m_(micro_batches), s_(stages), training_(training) {
    for (int s = 0; s < stages; ++s) {
      std::vector<PipeInstruction> flat;
      for (const PipeStep& step : training ? train_schedule(micro_batches, stages, s)
                                           : inference_schedule(micro_batches, stages, s)) {
        flat.insert(flat.end(), step.begin(), step.end());
      }
      programs_.push_back(flat);
    }
    pc_.assign(stages, 0);
    buffers_.assign(stages, {});
    forwards_.assign(stages, {});
    backwards_.assign(stages, {});
    grads_in_.assign(stages, {});
    steps_.assign(stages, 0);
  }

  // Runs to the end; the problems found (empty when the schedules are sound).
  std::vector<std::string> run() {
    while (true) {
      bool done = true, progress = false;
      for (int s = 0; s < s_; ++s) {
        if (pc_[s] >= programs_[s].size()) continue;
        done = false;
        progress = advance(s) || progress;
      }
      if (done) break;
      if (!progress) {
        std::ostringstream o;
        o << "deadlock: every stage waits;";
        for (int s = 0; s < s_; ++s) {
          if (pc_[s] < programs_[s].size()) {
            o << " stage " << s << " at " << to_string(programs_[s][pc_[s]]);
          }
        }
        problem(o.str());
        break;
      }
    }
    for (int s = 0; s < s_; ++s) {
      for (int mb = 0; mb < m_; ++mb) {
        if (forwards_[s].count(mb) != 1)
          problem(where(s) + "micro-batch " + std::to_string(mb) + " had no forward");
        if (training_ && backwards_[s].count(mb) != 1) {
          problem(where(s) + "micro-batch " + std::to_string(mb) + " had no backward");
        }
      }
      if (training_ && steps_[s] != 1)
        problem(where(s) + "optimizer steps: " + std::to_string(steps_[s]) + ", expected 1");
    }
    return problems_;
  }

 private:
  std::string where(int s) const { return "stage " + std::to_string(s) + ": "; }
  void problem(const std::string& p) { problems_.push_back(p); }

  // Puts micro-batch mb in buffer b of stage s: the buffer must be free or hold mb already.
  void place(int s, const PipeInstruction& in) {
    auto [it, fresh] = buffers_[s].emplace(in.buffer, in.micro_batch);
    if (!fresh && it->second != in.micro_batch) {
      problem(where(s) + to_string(in) + " for micro-batch " + std::to_string(in.micro_batch) +
              " overwrites micro-batch " + std::to_string(it->second) + " still in flight");
    }
  }
  // Buffer b of stage s must hold the instruction's micro-batch.
  bool holds(int s, const PipeInstruction& in) {
    auto it = buffers_[s].find(in.buffer);
    if (it == buffers_[s].end() || it->second != in.micro_batch) {
      problem(where(s) + to_string(in) + " expected micro-batch " + std::to_string(in.micro_batch) +
              " in its buffer");
      return false;
    }
    return true;
  }
  void release(int s, int buffer) { buffers_[s].erase(buffer); }

  // Runs stage s's next instruction if it can; false when it waits for a peer.
  bool advance(int s) {
    const PipeInstruction& in = programs_[s][pc_[s]];
    const bool first = s == 0, last = s == s_ - 1;
    switch (in.op) {
      case PipeOp::recv_activation:
      case PipeOp::recv_grad:
        return false;  // completes with the peer's send
      case PipeOp::send_activation: {
        if (last) problem(where(s) + "the last stage sends an activation");
        if (!holds(s, in) || forwards_[s].count(in.micro_batch) == 0) {
          problem(where(s) + to_string(in) + " before its forward");
        }
        if (!match(s + 1, PipeOp::recv_activation, in.micro_batch)) return false;
        if (!training_) release(s, in.buffer);
        break;
      }
      case PipeOp::send_grad: {
        if (first) problem(where(s) + "the first stage sends a gradient");
        if (!holds(s, in) || backwards_[s].count(in.micro_batch) == 0) {
          problem(where(s) + to_string(in) + " before its backward");
        }
        if (!match(s - 1, PipeOp::recv_grad, in.micro_batch)) return false;
        release(s, in.buffer);
        break;
      }
      case PipeOp::load_micro_batch:
        if (!first && !last) problem(where(s) + "a middle stage loads data");
        place(s, in);
        break;
      case PipeOp::forward:
        if (holds(s, in) && !forwards_[s].insert(in.micro_batch).second) {
          problem(where(s) + "a second forward of micro-batch " + std::to_string(in.micro_batch));
        }
        if (!training_ && last) release(s, in.buffer);
        break;
      case PipeOp::backward:
        if (holds(s, in)) {
          if (forwards_[s].count(in.micro_batch) == 0) {
            problem(where(s) + "backward of micro-batch " + std::to_string(in.micro_batch) +
                    " before its forward");
          }
          if (!last && grads_in_[s].count(in.micro_batch) == 0) {
            problem(where(s) + "backward of micro-batch " + std::to_string(in.micro_batch) +
                    " before its gradient arrived");
          }
          if (!backwards_[s].insert(in.micro_batch).second) problem(where(s) + "a second backward");
        }
        if (first) release(s, in.buffer);  // nothing to send upstream
        break;
      case PipeOp::reduce_tied_grads:
      case PipeOp::reduce_grads:
        if (static_cast<int>(backwards_[s].size()) != m_) {
          problem(where(s) + to_string(in) + " before every backward");
        }
        break;
      case PipeOp::optimizer_step:
        ++steps_[s];
        break;
    }
    ++pc_[s];
    return true;
  }

  // When stage `peer` waits in the receive of op for mb, completes it and returns true.
  bool match(int peer, PipeOp op, int mb) {
    if (peer < 0 || peer >= s_ || pc_[peer] >= programs_[peer].size()) return false;
    const PipeInstruction& in = programs_[peer][pc_[peer]];
    if (in.op != op) return false;
    if (in.micro_batch != mb) {
      problem(where(peer) + to_string(in) + " receives micro-batch " +
              std::to_string(in.micro_batch) + " but the peer sends micro-batch " +
              std::to_string(mb));
    }
    if (op == PipeOp::recv_activation) {
      place(peer, in);
    } else if (holds(peer, in)) {
      grads_in_[peer].insert(mb);
    }
    ++pc_[peer];
    return true;
  }

  int m_, s_;
  bool training_;
  std::vector<std::vector<PipeInstruction>> programs_;
  std::vector<size_t> pc_;
  std::vector<std::map<int, int>> buffers_;  // buffer -> micro-batch in flight
  std::vector<std::set<int>> forwards_, backwards_, grads_in_;
  std::vector<int> steps_;
  std::vector<std::string> problems_;
};

TEST_CASE("train schedules for every S <= 8, M <= 16 run to completion soundly", "[pipeline]") {
  for (int stages = 1; stages <= 8; ++stages) {
    for (int m = 1; m <= 16; ++m) {
      INFO(stages << " stages, " << m << " micro-batches");
      const std::vector<std::string> problems = Simulation(m, stages, true).run();
      CHECK(problems == std::vector<std::string>{});
      // Sends and receives pair up on the same step, so a barrier per step is safe.
      for (int s = 0; s + 1 < stages; ++s) {
        const std::vector<PipeStep> a = train_schedule(m, stages, s);
        const std::vector<PipeStep> b = train_schedule(m, stages, s + 1);
        REQUIRE(a.size() == b.size());
        for (size_t k = 0; k < a.size(); ++k) {
          auto mbs = [](const PipeStep& step, PipeOp op) {
            std::vector<int> out;
            for (const PipeInstruction& in : step) {
              if (in.op == op) out.push_back(in.micro_batch);
            }
            return out;
          };
          CHECK(mbs(a[k], PipeOp::send_activation) == mbs(b[k], PipeOp::recv_activation));
          CHECK(mbs(b[k], PipeOp::send_grad) == mbs(a[k], PipeOp::recv_grad));
        }
      }
      // At most `buffers` micro-batches in flight (forward done, backward not yet).
      for (int s = 0; s < stages; ++s) {
        int in_flight = 0, peak = 0;
        for (const PipeStep& step : train_schedule(m, stages, s)) {
          for (const PipeInstruction& in : step) {
            if (in.op == PipeOp::forward) peak = std::max(peak, ++in_flight);
            if (in.op == PipeOp::backward) --in_flight;
          }
        }
        CHECK(peak <= train_buffers(m, stages, s));
        CHECK(peak == std::min(stages - s, m));  // 1F1B: S - s warm-up forwards
      }
    }
  }
}

TEST_CASE("inference schedules for every S <= 8, M <= 16 run to completion soundly", "[pipeline]") {
  for (int stages = 1; stages <= 8; ++stages) {
    for (int m = 1; m <= 16; ++m) {
      INFO(stages << " stages, " << m << " micro-batches");
      CHECK(Simulation(m, stages, false).run() == std::vector<std::string>{});
      const std::vector<PipeStep> last = inference_schedule(m, stages, stages - 1);
      CHECK(static_cast<int>(last.size()) == m + stages - 1);
      CHECK(steps_with(last, PipeOp::forward).front() == stages - 1);
    }
  }
}

}  // namespace
}  // namespace tessera::parallel::pipeline
