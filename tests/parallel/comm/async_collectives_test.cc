// Collectives started now and waited on later (Note [Asynchronous collectives] in
// parallel/comm/async_collectives.h): the same bits as the blocking calls, several in
// flight at once in their start order, the caller free while the simulated link carries
// them, errors at wait(), a backend bound to its caller's thread running them at start, and
// one that leaves them queued on its device (NCCL's protocol, played by a fake backend).
// Ranks record what they see; the checks run after run_thread_ranks returns (Catch2
// assertions are not thread-safe).
#include "parallel/comm/async_collectives.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/factories.h"
#include "parallel/comm/host_staged_comm.h"
#include "parallel/comm/thread_comm.h"
#include "tests/testing.h"

namespace tessera::parallel {
namespace {

using Clock = std::chrono::steady_clock;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// What a queueing backend was asked, in order.
struct QueueLog {
  std::vector<std::string> calls;
  bool finished = false;   // the device has passed every queued operation
  bool fail_wait = false;  // the host's wait finds a failure (a lost peer)
};

class FakeWork final : public QueuedWork {
 public:
  FakeWork(QueueLog& log, int id) : log_(log), id_(std::to_string(id)) {}
  void order_device_after() override { log_.calls.push_back("order " + id_); }
  bool finished() override { return log_.finished; }
  void wait() override {
    log_.calls.push_back("wait " + id_);
    TS_CHECK(!log_.fail_wait, "operation ", id_, " lost its peer");
  }

 private:
  QueueLog& log_;
  std::string id_;
};

// Rank 0 of two that moves nothing and leaves every operation queued, as NCCL does: Note
// [Device-queued operations] in parallel/comm/communicator.h without a device.
class QueueingComm final : public Communicator {
 public:
  explicit QueueingComm(QueueLog& log) : Communicator(0, 2, "queueing", {}), log_(log) {}
  bool runs_on_any_thread() const override { return false; }
  std::unique_ptr<QueuedWork> queue(const std::function<void()>& ops) override {
    ops();
    return std::make_unique<FakeWork>(log_, queued_++);
  }

 protected:
  void do_all_reduce(const Tensor&, ReduceOp) override { log_.calls.push_back("all_reduce"); }
  void do_reduce_scatter(const Tensor&, const Tensor&, ReduceOp) override { unused(); }
  void do_all_gather(const Tensor&, const Tensor&) override { unused(); }
  void do_all_to_all(const Tensor&, const Tensor&) override { unused(); }
  void do_broadcast(const Tensor&, int) override { unused(); }
  void do_send(const Tensor&, int) override { unused(); }
  void do_recv(const Tensor&, int) override { unused(); }
  void do_barrier() override { unused(); }
  std::unique_ptr<Communicator> do_split(int, int) override { unused(); }
  bool supports(Device) const override { return true; }

 private:
  [[noreturn]] static void unused() { TS_FAIL("QueueingComm: only all_reduce is played"); }
  QueueLog& log_;
  int queued_ = 0;
};

}  // namespace

TEST_CASE("a backend that queues on its device: wait() orders the device, wait_all() the host",
          "[comm][async]") {
  QueueLog log;
  QueueingComm comm(log);
  AsyncCollectives async(comm);
  CHECK_FALSE(async.overlaps());  // no worker: the backend queues instead
  const Tensor t = full({4}, 1.0);
  const CommHandle first = async.all_reduce(t);
  const CommHandle second = async.all_reduce(t);
  CHECK(log.calls == std::vector<std::string>{"all_reduce", "all_reduce"});
  CHECK_FALSE(first.done());  // queued, and the device has not passed it
  first.wait();               // the device waits for it; the host does not
  CHECK(log.calls.back() == "order 0");
  log.finished = true;
  CHECK(first.done());
  log.calls.clear();
  async.wait_all();
  CHECK(log.calls == std::vector<std::string>{"order 0", "wait 0", "order 1", "wait 1"});

  // A failure found by the host's wait surfaces in wait_all(), not in wait().
  log.calls.clear();
  log.finished = false;
  log.fail_wait = true;
  const CommHandle lost = async.all_reduce(t);
  CHECK_NOTHROW(lost.wait());
  CHECK_THAT(testing::error_of([&] { async.wait_all(); }),
             Catch::Contains("operation 2 lost its peer"));
  // The handle keeps the failure: its wait() rethrows it from then on.
  CHECK(lost.failed());
  CHECK_THAT(testing::error_of([&] { lost.wait(); }), Catch::Contains("operation 2 lost its peer"));
  log.fail_wait = false;
}

TEST_CASE("started collectives give the blocking calls' bits, several in flight", "[comm][async]") {
  for (int world : {1, 2, 3, 4}) {
    std::vector<int> equal(world, 0);
    std::vector<int> overlapped(world, -1);
    run_thread_ranks(world, [&](Communicator& comm) {
      Generator gen(100 + comm.rank());
      // Mixed sizes and ops, so a rank that ran them out of order would pair mismatched ones.
      const Tensor a = randn({world * 1000}, gen);
      const Tensor b = randn({world * 37}, gen, {DType::bf16});
      const Tensor c = randn({53}, gen);
      Tensor a_blocking = a.clone(), c_blocking = empty({world * 53});
      Tensor b_blocking = empty({37}, {DType::bf16});
      comm.all_reduce(a_blocking);
      comm.reduce_scatter(b, b_blocking);
      comm.all_gather(c, c_blocking);
      const Tensor a_async = a.clone();
      const Tensor b_async = empty({37}, {DType::bf16});
      const Tensor c_async = empty({world * 53});
      int ok = 0;
      {
        AsyncCollectives async(comm);
        overlapped[comm.rank()] = async.overlaps();
        // Rank 0 starts them slowly, so its worker finds one at a time in its queue and
        // the others' find several: the order must not depend on that.
        const auto pause = [&] {
          if (comm.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        };
        const CommHandle ha = async.all_reduce(a_async);
        pause();
        const CommHandle hb = async.reduce_scatter(b, b_async);
        pause();
        const CommHandle hc = async.all_gather(c, c_async);
        hb.wait();  // out of order: each waits for its own operation only
        ha.wait();
        async.wait_all();
        ok = ha.done() && hb.done() && hc.done();
      }
      equal[comm.rank()] = ok && same_bits(a_async, a_blocking) && same_bits(b_async, b_blocking) &&
                           same_bits(c_async, c_blocking);
    });
    INFO("world " << world);
    for (int r = 0; r < world; ++r) {
      CHECK(equal[r] == 1);
      CHECK(overlapped[r] == (world > 1 ? 1 : 0));
    }
  }
}

TEST_CASE("a started collective leaves the caller free while the link carries it",
          "[comm][async]") {
  // 2 MB all-reduced at world 2 over 0.2 Gbit/s: at least 2 x 1/2 x 2 MB x 8 / 0.2e9 = 80 ms.
  std::vector<double> start_seconds(2, -1), total_seconds(2, -1);
  std::vector<int> pending_after_start(2, -1), sums_right(2, 0);
  run_thread_ranks(2, [&](Communicator& comm) {
    comm.set_simulated_link({.gbit_per_s = 0.2, .latency_us = 0});
    const Tensor t = full({512 * 1024}, comm.rank() + 1.0);
    AsyncCollectives async(comm);
    const auto start = Clock::now();
    const CommHandle h = async.all_reduce(t);
    start_seconds[comm.rank()] = std::chrono::duration<double>(Clock::now() - start).count();
    pending_after_start[comm.rank()] = !h.done();
    h.wait();
    total_seconds[comm.rank()] = std::chrono::duration<double>(Clock::now() - start).count();
    sums_right[comm.rank()] = t.to_vector<double>()[12345] == 3.0;
  });
  for (int r = 0; r < 2; ++r) {
    CHECK(pending_after_start[r] == 1);
    CHECK(start_seconds[r] < 0.04);  // the start does not wait for the 80 ms
    CHECK(total_seconds[r] >= 0.079);
    CHECK(sums_right[r] == 1);
  }
}

TEST_CASE("a started collective's error comes from its wait, and breaks the group",
          "[comm][async]") {
  std::vector<std::string> first(2), second(2), behind(2);
  run_thread_ranks(
      2,
      [&](Communicator& comm) {
        AsyncCollectives async(comm);
        const CommHandle bad = async.all_reduce(zeros({comm.rank() == 0 ? 4 : 5}));
        const CommHandle after = async.all_reduce(zeros({3}));
        try {
          bad.wait();
        } catch (const Error& e) {
          first[comm.rank()] = e.what();
        }
        try {
          after.wait();
        } catch (const Error& e) {
          behind[comm.rank()] = e.what();
        }
        try {
          async.wait_all();
        } catch (const Error& e) {
          second[comm.rank()] = e.what();
        }
      },
      CommOptions{.timeout = std::chrono::seconds(5)});
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << first[r] << " / " << behind[r] << " / " << second[r]);
    CHECK_THAT(first[r], Catch::Contains("all_reduce #0: ranks disagree"));
    CHECK_THAT(behind[r], Catch::Contains("all_reduce #1: the group is unusable"));
    // wait_all reports the first failed operation of those started: the same error.
    CHECK(second[r] == first[r]);
  }
}

TEST_CASE("a cancelled receive ends at once with the reason, and breaks the group",
          "[comm][async]") {
  // Rank 1 sends nothing until rank 0 has cancelled; without cancel() rank 0's receive would
  // wait for its minute-long timeout and fail with "timed out".
  std::string received, after;
  std::atomic<bool> cancelled{false};
  run_thread_ranks(
      2,
      [&](Communicator& comm) {
        if (comm.rank() == 1) {
          while (!cancelled.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          return;
        }
        AsyncCollectives async(comm);
        const CommHandle h = async.recv(zeros({3}), 1);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the worker is waiting
        comm.cancel("stage 0 failed");
        try {
          h.wait();
        } catch (const Error& e) {
          received = e.what();
        }
        try {
          async.send(zeros({3}), 1).wait();
        } catch (const Error& e) {
          after = e.what();
        }
        cancelled = true;
      },
      CommOptions{.timeout = std::chrono::seconds(60)});
  CHECK_THAT(received, Catch::Contains("recv #0: cancelled: stage 0 failed"));
  CHECK_THAT(after, Catch::Contains("send #1: the group is unusable after an earlier failure"));
}

TEST_CASE("a cancelled send is withdrawn: the peer's later receive does not find it",
          "[comm][async]") {
  // Rank 0's send is cancelled before rank 1 receives; its tensor is gone with the
  // operation, so rank 1's receive must wait (and time out), not copy from it.
  std::string sent, received;
  std::atomic<bool> cancelled{false};
  run_thread_ranks(
      2,
      [&](Communicator& comm) {
        if (comm.rank() == 1) {
          while (!cancelled.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          try {
            comm.recv(zeros({3}), 0);
          } catch (const Error& e) {
            received = e.what();
          }
          return;
        }
        {
          AsyncCollectives async(comm);
          const CommHandle h = async.send(full({3}, 7.0), 1);
          std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the worker is waiting
          comm.cancel("stage 0 failed");
          try {
            h.wait();
          } catch (const Error& e) {
            sent = e.what();
          }
        }
        cancelled = true;
      },
      CommOptions{.timeout = std::chrono::milliseconds(300)});
  CHECK_THAT(sent, Catch::Contains("send #0: cancelled: stage 0 failed"));
  CHECK_THAT(received, Catch::Contains("recv #0: timed out"));
}

TEST_CASE("a backend bound to its caller's thread runs started collectives at once",
          "[comm][async]") {
  std::vector<int> at_once(2, 0);
  run_thread_ranks(2, [&](Communicator& cpu) {
    const std::unique_ptr<Communicator> staged = host_staged(cpu);
    AsyncCollectives async(*staged);
    const Tensor t = full({8}, 1.0);
    const CommHandle h = async.all_reduce(t);
    at_once[cpu.rank()] = !async.overlaps() && h.done() && t.to_vector<double>()[0] == 2.0;
  });
  CHECK(at_once == std::vector<int>{1, 1});
}

}  // namespace tessera::parallel
