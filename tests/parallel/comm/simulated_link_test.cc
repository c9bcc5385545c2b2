// The simulated link of Note [Simulated link]: operations of a group of two or more ranks
// last at least the modeled time, CommStats records it, split groups inherit the link, and
// a group of one or a link that is off adds nothing. Ranks record what they see; the test
// checks it after run_thread_ranks returns (Catch2 assertions are not thread-safe).
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/factories.h"
#include "parallel/comm/communicator.h"
#include "parallel/comm/thread_comm.h"
#include "tests/testing.h"

namespace tessera::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// What one rank saw of one operation.
struct Seen {
  double elapsed = -1;    // wall seconds of the call
  double simulated = -1;  // CommStats' modeled seconds after it
};

// Runs `op` once on every one of `size` ranks behind `link`; what each rank saw. Times
// count from one start before the ranks' threads begin: a rank whose thread starts late
// (a loaded host) must not see a shorter wait for data another rank sent.
template <class F>
std::vector<Seen> timed(int size, const SimulatedLink& link, F&& op) {
  std::vector<Seen> seen(size);
  const auto start = Clock::now();
  run_thread_ranks(size, [&](Communicator& comm) {
    comm.set_simulated_link(link);
    op(comm);
    seen[comm.rank()] = {seconds_since(start), comm.stats().total_simulated_seconds()};
  });
  return seen;
}

TEST_CASE("a recv waiting for its sender gets the data a link time after the send",
          "[comm][simulated_link]") {
  // The link carries a message in 50 ms (latency); rank 0 sends 60 ms after rank 1 began
  // receiving, so the data is there at 110 ms, not when the send began (60 ms).
  const SimulatedLink link{.gbit_per_s = 100, .latency_us = 50'000};
  const std::vector<Seen> seen = timed(2, link, [](Communicator& comm) {
    const Tensor t = zeros({4});
    if (comm.rank() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(60));
      comm.send(t, 1);
    } else {
      comm.recv(t, 0);
    }
  });
  CHECK(seen[1].elapsed >= 0.110);
  CHECK(seen[0].elapsed >= 0.110);  // 60 ms asleep, then the send's 50 ms
}

TEST_CASE("ring steps per op", "[comm][simulated_link]") {
  CHECK(ring_steps(CommOp::all_reduce, 4) == 6);
  CHECK(ring_steps(CommOp::reduce_scatter, 4) == 3);
  CHECK(ring_steps(CommOp::all_gather, 4) == 3);
  CHECK(ring_steps(CommOp::all_to_all, 4) == 3);
  CHECK(ring_steps(CommOp::broadcast, 4) == 1);
  CHECK(ring_steps(CommOp::send, 2) == 1);
  CHECK(ring_steps(CommOp::recv, 2) == 1);
  CHECK(ring_steps(CommOp::barrier, 4) == 0);
  CHECK(ring_steps(CommOp::split, 4) == 0);
  CHECK(ring_steps(CommOp::all_reduce, 1) == 0);
  CHECK(SimulatedLink{}.seconds(1'000'000, 10) == 0);  // off
  CHECK(SimulatedLink{0.5, 20}.seconds(1'000'000, 3) == Approx(60e-6 + 8e6 / 0.5e9));
}

TEST_CASE("an all_reduce lasts at least its bytes' time on the link", "[comm][simulated_link]") {
  const int n = 2;
  const SimulatedLink link{0.1, 0};
  const int64_t numel = 250'000;  // 1 MB of f32
  // A ring all_reduce sends 2 (N-1)/N of the tensor from each rank: 1e6 bytes here.
  const double modeled = 2.0 * (n - 1) / n * (numel * 4) * 8 / (link.gbit_per_s * 1e9);
  REQUIRE(modeled == Approx(0.08));
  std::vector<double> sums(n);
  const std::vector<Seen> seen = timed(n, link, [&](Communicator& comm) {
    Tensor t = full({numel}, static_cast<double>(comm.rank() + 1), {DType::f32});
    comm.all_reduce(t);
    sums[comm.rank()] = t.to_vector<double>()[numel - 1];
  });
  for (int r = 0; r < n; ++r) {
    CHECK(sums[r] == 3);  // the data is still right
    CHECK(seen[r].elapsed >= modeled);
    CHECK(seen[r].simulated == Approx(modeled).epsilon(1e-12));
  }
}

// Note [Simulated link]: the link carries one operation at a time, each from when it was
// issued or the link finished the one before. Two operations issued at the same moment
// (as an AsyncCollectives worker runs them, set_issued_at) end one link time apart; an
// operation issued long ago on an idle link ends as soon as the backend returns.
TEST_CASE("the link carries operations one at a time from when they were issued",
          "[comm][simulated_link]") {
  const int n = 2;
  const SimulatedLink link{0.1, 0};
  const int64_t numel = 250'000;  // 1 MB of f32: 0.08 s for an all_reduce at 0.1 Gbit/s
  const double modeled = 2.0 * (n - 1) / n * (numel * 4) * 8 / (link.gbit_per_s * 1e9);
  std::vector<double> both(n), stale(n);
  run_thread_ranks(n, [&](Communicator& comm) {
    comm.set_simulated_link(link);
    Tensor t = zeros({numel});
    comm.barrier();
    const Clock::time_point issued = Clock::now();
    comm.set_issued_at(issued);
    comm.all_reduce(t);
    comm.set_issued_at(issued);  // issued with the first: it waits for the link
    comm.all_reduce(t);
    both[comm.rank()] = seconds_since(issued);
    comm.barrier();
    std::this_thread::sleep_for(std::chrono::duration<double>(2 * modeled));  // the link idles
    const Clock::time_point start = Clock::now();
    comm.set_issued_at(start - std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(2 * modeled)));
    comm.all_reduce(t);
    stale[comm.rank()] = seconds_since(start);
  });
  for (int r = 0; r < n; ++r) {
    CHECK(both[r] >= 2 * modeled);    // the second waited for the link
    CHECK(stale[r] < 0.5 * modeled);  // its link time passed before the call
  }
}

TEST_CASE("latency adds one delay per ring step", "[comm][simulated_link]") {
  const int n = 3;
  const SimulatedLink link{1000, 5000};  // fast enough that 12 bytes cost ~1e-10 s
  const std::vector<Seen> seen = timed(n, link, [&](Communicator& comm) {
    Tensor t = zeros({3}, {DType::f32});
    comm.all_reduce(t);  // 2 (N-1) = 4 steps
  });
  const double modeled = 4 * 5000e-6 + 2.0 * 2 / 3 * 12 * 8 / 1e12;
  for (const Seen& s : seen) {
    CHECK(s.elapsed >= modeled);
    CHECK(s.simulated == Approx(modeled).epsilon(1e-12));
  }
  // The same link for an all_gather: N-1 = 2 steps.
  const std::vector<Seen> gather = timed(n, link, [&](Communicator& comm) {
    comm.all_gather(zeros({1}, {DType::f32}), zeros({3}, {DType::f32}));
  });
  CHECK(gather[0].simulated == Approx(2 * 5000e-6).epsilon(1e-6));
}

TEST_CASE("a rank that receives waits for the bytes it receives", "[comm][simulated_link]") {
  const SimulatedLink link{0.1, 0};
  const double modeled = 1e6 * 8 / 1e8;  // 1 MB at 0.1 Gbit/s
  std::vector<CommStats> stats(2);
  const std::vector<Seen> seen = timed(2, link, [&](Communicator& comm) {
    Tensor t = zeros({250'000}, {DType::f32});
    if (comm.rank() == 0) {
      comm.send(t, 1);
    } else {
      comm.recv(t, 0);
    }
    stats[comm.rank()] = comm.stats();
  });
  CHECK(seen[1].elapsed >= modeled);
  CHECK(stats[0][CommOp::send].simulated_seconds == Approx(modeled));
  CHECK(stats[1][CommOp::recv].simulated_seconds == Approx(modeled));
  CHECK(stats[1][CommOp::recv].bytes_sent == 0);  // still counted as sent by rank 0 only
  CHECK(stats[0].summary().find("send: 1 calls, 1.00 MB sent, 0.080 s on the simulated link") !=
        std::string::npos);
}

TEST_CASE("a split group inherits the parent's link", "[comm][simulated_link]") {
  const SimulatedLink link{0.1, 100};
  std::vector<double> gbit(4), latency(4), simulated(4), elapsed(4);
  run_thread_ranks(4, [&](Communicator& comm) {
    comm.set_simulated_link(link);
    std::unique_ptr<Communicator> pair = comm.split(comm.rank() % 2, comm.rank());
    const int r = comm.rank();
    gbit[r] = pair->simulated_link().gbit_per_s;
    latency[r] = pair->simulated_link().latency_us;
    Tensor t = zeros({250'000}, {DType::f32});
    const auto start = Clock::now();
    pair->all_reduce(t);
    elapsed[r] = seconds_since(start);
    simulated[r] = pair->stats().total_simulated_seconds();
  });
  const double modeled = 2 * 100e-6 + 1e6 * 8 / 1e8;  // 2 ranks: 2 steps, 1 MB sent
  for (int r = 0; r < 4; ++r) {
    CHECK(gbit[r] == 0.1);
    CHECK(latency[r] == 100);
    CHECK(simulated[r] == Approx(modeled).epsilon(1e-12));
    CHECK(elapsed[r] >= modeled);
  }
}

TEST_CASE("a group of one is never delayed", "[comm][simulated_link]") {
  // 1 MB at 1 Mbit/s would take 8 s.
  const SimulatedLink slow{0.001, 1e5};
  const std::vector<Seen> one = timed(1, slow, [&](Communicator& comm) {
    Tensor t = zeros({250'000}, {DType::f32});
    comm.all_reduce(t);
    comm.broadcast(t, 0);
    comm.barrier();
  });
  CHECK(one[0].simulated == 0);
  CHECK(one[0].elapsed < 1.0);
  // Singletons split off a slow pair.
  std::vector<double> simulated(2, -1), elapsed(2, -1);
  run_thread_ranks(2, [&](Communicator& comm) {
    comm.set_simulated_link(slow);
    std::unique_ptr<Communicator> self = comm.split(comm.rank(), 0);
    Tensor t = zeros({250'000}, {DType::f32});
    const auto start = Clock::now();
    self->all_reduce(t);
    elapsed[comm.rank()] = seconds_since(start);
    simulated[comm.rank()] = self->stats().total_simulated_seconds();
  });
  CHECK(simulated == std::vector<double>{0, 0});
  CHECK(elapsed[0] < 1.0);
  CHECK(elapsed[1] < 1.0);
}

TEST_CASE("a link that is off adds nothing", "[comm][simulated_link]") {
  std::vector<CommStats> stats(2);
  const std::vector<Seen> seen = timed(2, SimulatedLink{}, [&](Communicator& comm) {
    Tensor t = zeros({250'000}, {DType::f32});
    comm.all_reduce(t);
    comm.broadcast(t, 1);
    stats[comm.rank()] = comm.stats();
  });
  for (const Seen& s : seen) CHECK(s.simulated == 0);
  CHECK(stats[0][CommOp::all_reduce].bytes_sent == 1'000'000);
  CHECK(stats[0].summary().find("simulated") == std::string::npos);
}

TEST_CASE("a bad link names what is wrong", "[comm][simulated_link]") {
  std::unique_ptr<Communicator> comm = std::move(make_thread_group(1)[0]);
  using Catch::Contains;
  CHECK_THAT(testing::error_of([&] {
               comm->set_simulated_link({-1, 0});
             }),
             Contains("[comm world] simulated link: expected a bandwidth >= 0 Gbit/s"));
  CHECK_THAT(testing::error_of([&] {
               comm->set_simulated_link({1, -5});
             }),
             Contains("expected a latency >= 0 us, found -5"));
  CHECK_THAT(testing::error_of([&] {
               comm->set_simulated_link({0, 50});
             }),
             Contains("a latency of 50 us needs a bandwidth"));
  CHECK_FALSE(comm->simulated_link().enabled());
  comm->set_simulated_link({2.5, 10});
  CHECK(comm->simulated_link().gbit_per_s == 2.5);
}

}  // namespace
}  // namespace tessera::parallel
