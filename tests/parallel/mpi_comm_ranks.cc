// The MPI backend (parallel/comm/mpi_comm.h) across real processes; mpi_comm_test.sh runs
// it under mpirun at 2 and 3 ranks.
//
//   mpirun -np 3 mpi_comm_ranks [Catch2 arguments]   the test cases, on every rank
//   mpirun -np 2 mpi_comm_ranks --fault=skip         rank 1 skips a barrier (then finalizes)
//   mpirun -np 2 mpi_comm_ranks --fault=exit         rank 1 exits without finalizing
//   mpirun -np 2 mpi_comm_ranks --fault=late         rank 1 creates its world too late
//
// Every rank runs the same test cases in the same order, so their collectives pair up; a
// case that fails on one rank meets a timeout on the others instead of a hang. Inputs are
// functions of (rank, index), so each rank computes every collective's result by itself.
// Each case works on its own duplicate of MPI_COMM_WORLD, so a case that breaks its group
// leaves the next one unharmed.
#define CATCH_CONFIG_RUNNER
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/factories.h"
#include "parallel/comm/async_collectives.h"
#include "parallel/comm/mpi_comm.h"
#include "tests/parallel/mpi_ranks.h"
#include "tests/testing.h"

using Catch::Matchers::Contains;
using tessera::DType;
using tessera::Tensor;
using tessera::parallel::AsyncCollectives;
using tessera::parallel::CommHandle;
using tessera::parallel::CommOp;
using tessera::parallel::CommOptions;
using tessera::parallel::Communicator;
using tessera::parallel::MpiRuntime;
using tessera::parallel::ReduceOp;
using tessera::parallel::testing::first_mismatch;
using tessera::parallel::testing::new_world;
using tessera::testing::error_of;
using namespace std::chrono_literals;

namespace {

// Set once by main() before any test runs; the runtime lives for the whole program.
const MpiRuntime* the_runtime = nullptr;

}  // namespace

namespace tessera::parallel::testing {

std::unique_ptr<Communicator> new_world(std::chrono::milliseconds timeout) {
  return tessera::parallel::mpi_world(*the_runtime, CommOptions{timeout});
}

}  // namespace tessera::parallel::testing

TEST_CASE("mpi world spans the processes of the job", "[mpi]") {
  auto comm = new_world(7s);
  CHECK(comm->name() == "world");
  CHECK(comm->rank() == the_runtime->world_rank());
  CHECK(comm->size() == the_runtime->world_size());
  CHECK(comm->options().timeout == 7s);
  CHECK(comm->sequence() == 0);
  CHECK(the_runtime->owns_mpi());
  // Only a launcher can start a world of several processes (alone, MPI runs a singleton).
  if (comm->size() > 1) CHECK(MpiRuntime::launched_by_mpirun());
}

TEST_CASE("mpi all_gather puts rank r's input in block r", "[mpi]") {
  auto comm = new_world();
  const int size = comm->size();
  // i64, and f16 and bool, which MPI moves as plain words and bytes.
  for (DType dtype : {DType::i64, DType::f16, DType::boolean}) {
    const int64_t n = 3;
    std::vector<double> mine(n);
    for (int64_t k = 0; k < n; ++k) {
      mine[k] = dtype == DType::boolean ? (comm->rank() + k) % 2 : comm->rank() * 10 + k;
    }
    const Tensor in = tessera::from_vector(mine).to(dtype);  // (n)
    const Tensor out = tessera::zeros({size * n}, {dtype});  // (size * n)
    comm->all_gather(in, out);
    std::vector<double> want(size * n);
    for (int r = 0; r < size; ++r) {
      for (int64_t k = 0; k < n; ++k) {
        want[r * n + k] = dtype == DType::boolean ? (r + k) % 2 : r * 10 + k;
      }
    }
    INFO("dtype " << tessera::dtype_name(dtype));
    CHECK(first_mismatch(out.to_vector<double>(), want) == -1);
  }
}

TEST_CASE("mpi collectives started on the worker thread give the blocking calls' results",
          "[mpi]") {
  // Note [Asynchronous collectives]: MpiRuntime asks for MPI_THREAD_MULTIPLE, so the
  // operations run on AsyncCollectives' worker, in their start order.
  auto comm = new_world();
  const int size = comm->size();
  const Tensor summed = tessera::full({1000}, comm->rank() + 1.0);  // (1000)
  const Tensor gathered = tessera::zeros({size * 2});               // (size * 2)
  const Tensor mine = tessera::full({2}, comm->rank() * 1.0);       // (2)
  bool overlaps = false;
  {
    AsyncCollectives async(*comm);
    overlaps = async.overlaps();
    const CommHandle sum = async.all_reduce(summed);
    const CommHandle gather = async.all_gather(mine, gathered);
    gather.wait();
    sum.wait();
  }
  CHECK(overlaps);
  CHECK(summed.to_vector<double>()[999] == size * (size + 1) / 2.0);
  std::vector<double> want(size * 2);
  for (int r = 0; r < size; ++r) want[2 * r] = want[2 * r + 1] = r;
  CHECK(first_mismatch(gathered.to_vector<double>(), want) == -1);
}

TEST_CASE("mpi all_to_all sends block j to rank j", "[mpi]") {
  auto comm = new_world();
  const int size = comm->size();
  const int64_t n = 4;
  // Element k of the block from rank i to rank j: i * 1000 + j * 10 + k.
  std::vector<int32_t> mine(size * n);
  for (int j = 0; j < size; ++j) {
    for (int64_t k = 0; k < n; ++k) mine[j * n + k] = comm->rank() * 1000 + j * 10 + k;
  }
  const Tensor in = tessera::from_vector(mine);                 // (size * n)
  const Tensor out = tessera::zeros({size * n}, {DType::i32});  // (size * n)
  comm->all_to_all(in, out);
  std::vector<int32_t> want(size * n);
  for (int i = 0; i < size; ++i) {
    for (int64_t k = 0; k < n; ++k) want[i * n + k] = i * 1000 + comm->rank() * 10 + k;
  }
  CHECK(first_mismatch(out.to_vector<int32_t>(), want) == -1);
}

TEST_CASE("mpi broadcast from a non-zero root", "[mpi]") {
  auto comm = new_world();
  const int root = comm->size() - 1;
  for (DType dtype : {DType::f32, DType::bf16, DType::u8}) {
    std::vector<double> mine(6);
    for (int k = 0; k < 6; ++k) mine[k] = comm->rank() * 20 + k;
    const Tensor t = tessera::from_vector(mine, {2, 3}).to(dtype);  // (2, 3)
    comm->broadcast(t, root);
    std::vector<double> want(6);
    for (int k = 0; k < 6; ++k) want[k] = root * 20 + k;
    INFO("dtype " << tessera::dtype_name(dtype));
    CHECK(t.shape() == tessera::Shape{2, 3});
    CHECK(first_mismatch(t.to_vector<double>(), want) == -1);
  }
}

TEST_CASE("mpi send and recv around a ring, in order", "[mpi]") {
  auto comm = new_world();
  const int size = comm->size();
  if (size < 2) return;
  const int next = (comm->rank() + 1) % size;
  const int prev = (comm->rank() + size - 1) % size;
  // A small message (sent eagerly) and a large one (1.6 MB, which waits for the receiver);
  // element k of the m-th message from rank r is r * 1e6 + m * 1e5 + k % 1000.
  auto message = [](int r, int m, int64_t n) {
    std::vector<double> v(n);
    for (int64_t k = 0; k < n; ++k) v[k] = r * 1e6 + m * 1e5 + k % 1000;
    return v;
  };
  const int64_t sizes[] = {5, 200000};
  auto send_all = [&] {
    for (int m = 0; m < 2; ++m) {
      comm->send(tessera::from_vector(message(comm->rank(), m, sizes[m])), next);
    }
  };
  std::vector<Tensor> got;
  auto recv_all = [&] {
    for (int m = 0; m < 2; ++m) {
      got.push_back(tessera::zeros({sizes[m]}, {DType::f64}));
      comm->recv(got.back(), prev);
    }
  };
  // Even ranks send first and odd ranks receive first, so that no cycle of blocked
  // senders forms, for any ring size.
  if (comm->rank() % 2 == 0) {
    send_all();
    recv_all();
  } else {
    recv_all();
    send_all();
  }
  for (int m = 0; m < 2; ++m) {
    INFO("message " << m << " from rank " << prev);
    CHECK(first_mismatch(got[m].to_vector<double>(), message(prev, m, sizes[m])) == -1);
  }
}

TEST_CASE("mpi barrier waits for the last rank", "[mpi]") {
  auto comm = new_world();
  if (comm->size() < 2) return;
  // Rank 0 arrives 300 ms late; the others must wait for it.
  const auto start = std::chrono::steady_clock::now();
  if (comm->rank() == 0) std::this_thread::sleep_for(300ms);
  comm->barrier();
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(waited >= 200ms);
  comm->barrier();
  CHECK(comm->stats()[CommOp::barrier].calls == 2);
  CHECK(comm->stats()[CommOp::barrier].bytes_sent == 0);
}

TEST_CASE("mpi split into even and odd ranks", "[mpi]") {
  auto world = new_world(5s);
  const int rank = world->rank();
  const int size = world->size();
  const int parity = rank % 2;
  // key = -rank: the child orders its ranks by descending parent rank.
  auto child = world->split(parity, -rank);
  REQUIRE(child != nullptr);
  int members = 0;
  int above = 0;  // same-parity ranks above mine: my rank in the child
  int64_t rank_sum = 0;
  for (int r = parity; r < size; r += 2) {
    ++members;
    above += r > rank;
    rank_sum += r;
  }
  CHECK(child->name() == "world:" + std::to_string(parity));
  CHECK(child->size() == members);
  CHECK(child->rank() == above);
  CHECK(child->options().timeout == 5s);
  // A reduction in the child covers the child's ranks only.
  const Tensor t = tessera::from_vector(std::vector<int64_t>{rank, 1});  // (2)
  child->all_reduce(t);
  CHECK(t.to_vector<int64_t>() == std::vector<int64_t>{rank_sum, members});
  // Splitting the child again extends the name.
  auto grandchild = child->split(0, 0);
  REQUIRE(grandchild != nullptr);
  CHECK(grandchild->name() == "world:" + std::to_string(parity) + ":0");
  CHECK(grandchild->size() == members);

  // A negative color joins no group.
  auto rest = world->split(rank == 0 ? -1 : 7, rank);
  if (rank == 0) {
    CHECK(rest == nullptr);
  } else {
    REQUIRE(rest != nullptr);
    CHECK(rest->name() == "world:7");
    CHECK(rest->size() == size - 1);
    CHECK(rest->rank() == rank - 1);
    rest->barrier();
  }
  CHECK(world->stats()[CommOp::split].calls == 2);
  CHECK(world->stats()[CommOp::split].bytes_sent == 0);
  CHECK(world->sequence() == 2);
}

TEST_CASE("mpi stats count calls and bytes per Note [Bytes sent]", "[mpi]") {
  auto comm = new_world();
  const int size = comm->size();
  const int rank = comm->rank();
  // A ring algorithm sends (N - 1) / N of the bytes per phase from each rank.
  const int64_t ring = size - 1;
  comm->all_reduce(tessera::zeros({1000}));  // 4000 bytes
  if (size == 2) CHECK(comm->stats()[CommOp::all_reduce].bytes_sent == 4000);
  CHECK(comm->stats()[CommOp::all_reduce].bytes_sent == 2 * 4000 * ring / size);
  comm->all_reduce(tessera::zeros({10}, {DType::f64}));  // 80 bytes
  CHECK(comm->stats()[CommOp::all_reduce].calls == 2);
  CHECK(comm->stats()[CommOp::all_reduce].bytes_sent ==
        2 * 4000 * ring / size + 2 * 80 * ring / size);

  comm->reduce_scatter(tessera::zeros({size * 10}, {DType::f64}),
                       tessera::zeros({10}, {DType::f64}));  // in: size * 80 bytes
  CHECK(comm->stats()[CommOp::reduce_scatter].bytes_sent == 80 * ring);
  comm->all_gather(tessera::zeros({10}, {DType::f64}),
                   tessera::zeros({size * 10}, {DType::f64}));  // out: size * 80 bytes
  CHECK(comm->stats()[CommOp::all_gather].bytes_sent == 80 * ring);
  comm->all_to_all(tessera::zeros({size * 10}, {DType::i32}),
                   tessera::zeros({size * 10}, {DType::i32}));  // in: size * 40 bytes
  CHECK(comm->stats()[CommOp::all_to_all].bytes_sent == 40 * ring);
  comm->broadcast(tessera::zeros({25}), 0);  // 100 bytes, sent by the root only
  CHECK(comm->stats()[CommOp::broadcast].bytes_sent == (rank == 0 && size > 1 ? 100 : 0));
  comm->barrier();
  CHECK(comm->stats()[CommOp::barrier].calls == 1);
  CHECK(comm->stats()[CommOp::barrier].bytes_sent == 0);
  int64_t p2p = 0;
  if (size >= 2 && rank < 2) {
    // Rank 0 sends 7 f32 to rank 1.
    const Tensor t = tessera::zeros({7});
    if (rank == 0) comm->send(t, 1);
    if (rank == 1) comm->recv(t, 0);
    p2p = rank == 0 ? 28 : 0;
    CHECK(comm->stats()[rank == 0 ? CommOp::send : CommOp::recv].calls == 1);
    CHECK(comm->stats()[rank == 0 ? CommOp::send : CommOp::recv].bytes_sent == p2p);
  }
  CHECK(comm->stats().total_bytes_sent() == 2 * 4000 * ring / size + 2 * 80 * ring / size +
                                                80 * ring + 80 * ring + 40 * ring +
                                                (rank == 0 && size > 1 ? 100 : 0) + p2p);
  CHECK_THAT(comm->stats().summary(), Contains("all_reduce: 2 calls"));
  comm->reset_stats();
  CHECK(comm->stats().total_bytes_sent() == 0);
  CHECK(comm->stats()[CommOp::all_reduce].calls == 0);
}

TEST_CASE("mpi argument errors fail locally and name the op", "[mpi]") {
  {
    // Every rank passes the same wrong size, so every rank fails before communicating.
    auto comm = new_world();
    const Tensor in = tessera::zeros({4});
    const Tensor out = tessera::zeros({4 * comm->size() + 1});
    CHECK_THAT(error_of([&] { comm->all_gather(in, out); }),
               Contains("all_gather #0") && Contains("expected out to hold") &&
                   Contains("[comm world, rank " + std::to_string(comm->rank())));
    // The group is broken from then on.
    CHECK_THAT(error_of([&] { comm->barrier(); }), Contains("barrier #1") && Contains("unusable"));
  }
  {
    // A bool sum has no bool result.
    auto comm = new_world();
    const Tensor flags = tessera::zeros({8}, {DType::boolean});
    CHECK_THAT(error_of([&] { comm->all_reduce(flags); }),
               Contains("all_reduce #0") && Contains("found bool"));
  }
  {
    auto comm = new_world();
    const Tensor flags = tessera::zeros({8}, {DType::boolean});
    CHECK_THAT(error_of([&] { comm->all_reduce(flags, ReduceOp::max); }),
               Contains("all_reduce #0") && Contains("found bool"));
  }
}

TEST_CASE("mpi a cancelled receive on the worker ends at once with the reason", "[mpi]") {
  // Rank 1 sends only after rank 0 has cancelled (and the other world's barrier says so),
  // completing the receive MPI still holds; without cancel() rank 0 would wait for the
  // minute-long timeout and fail with "timed out".
  auto comm = new_world(std::chrono::minutes(1));
  auto after = new_world();
  if (comm->size() < 2 || comm->rank() > 1) {
    after->barrier();
    return;
  }
  if (comm->rank() == 1) {
    after->barrier();
    comm->send(tessera::zeros({3}), 0);
    return;
  }
  std::string received, later;
  {
    AsyncCollectives async(*comm);
    const CommHandle h = async.recv(tessera::zeros({3}), 1);
    std::this_thread::sleep_for(20ms);  // the worker is waiting
    comm->cancel("stage 0 failed");
    received = error_of([&] { h.wait(); });
    later = error_of([&] { async.send(tessera::zeros({3}), 1).wait(); });
  }
  after->barrier();
  CHECK_THAT(received, Contains("recv #0: cancelled: stage 0 failed"));
  CHECK_THAT(later, Contains("send #1: the group is unusable after an earlier failure"));
}

TEST_CASE("mpi recv of a message of another size fails with both sizes", "[mpi]") {
  {
    auto comm = new_world();
    if (comm->size() < 2) return;
    if (comm->rank() == 0) comm->send(tessera::zeros({5}), 1);
    if (comm->rank() == 1) {
      const Tensor t = tessera::zeros({6});
      CHECK_THAT(error_of([&] { comm->recv(t, 0); }),
                 Contains("recv #0") && Contains("expected 6 elements from rank 0, found 5"));
    }
  }
  {
    // A longer message is MPI's own error, reported with the call and MPI's message.
    auto comm = new_world();
    if (comm->rank() == 0) comm->send(tessera::zeros({5}), 1);
    if (comm->rank() == 1) {
      const Tensor t = tessera::zeros({4});
      CHECK_THAT(error_of([&] { comm->recv(t, 0); }),
                 Contains("recv #0: MPI_Irecv failed: MPI_ERR_TRUNCATE"));
    }
  }
}

TEST_CASE("mpi a collective that a peer skips times out, naming the group and the op", "[mpi]") {
  auto comm = new_world(500ms);
  if (comm->size() < 2) return;
  comm->barrier();                // #0, with everyone
  if (comm->rank() != 0) return;  // the others never call barrier #1
  const auto start = std::chrono::steady_clock::now();
  const std::string error = error_of([&] { comm->barrier(); });
  const auto took = std::chrono::steady_clock::now() - start;
  // The others are creating the next test case's world: busy elsewhere, so they do not
  // answer the roll call (Note [Roll call] in parallel/comm/mpi_roll_call.h).
  std::string silent = "1";
  for (int r = 2; r < comm->size(); ++r) silent += ", " + std::to_string(r);
  CHECK(error == "[comm world, rank 0 of " + std::to_string(comm->size()) +
                     "] barrier #1: timed out after 500 ms: rank(s) " + silent +
                     " did not answer a roll call in 500 ms (exited, stopped, or busy outside "
                     "communication)");
  CHECK(took >= 1000ms);  // the timeout, then the roll call's listening
  CHECK(took < 5s);
}

TEST_CASE("mpi a collective timeout names the rank that waits in another operation", "[mpi]") {
  const int last = the_runtime->world_size() - 1;
  const int rank = the_runtime->world_rank();
  new_world()->barrier();  // the previous case left the ranks at different times
  // The last rank waits longer, so that it still answers when the others time out. The
  // middle ranks time out first: rank 0 answers their roll calls while it still waits and
  // must count them as heard, since they do not answer its own.
  const auto timeout = rank == last ? 3000ms : rank == 0 ? 500ms : 300ms;
  auto comm = new_world(timeout);
  if (comm->size() < 2) return;
  comm->barrier();  // #0, with everyone
  if (comm->rank() == last) {
    const Tensor t = tessera::zeros({2});
    CHECK(error_of([&] { comm->recv(t, 0); }) ==
          tessera::str_cat("[comm world, rank ", last, " of ", comm->size(),
                           "] recv #1: timed out after 3000 ms waiting for rank 0 (exited, or "
                           "called a different operation)"));
    return;
  }
  CHECK(error_of([&] { comm->barrier(); }) ==
        tessera::str_cat("[comm world, rank ", comm->rank(), " of ", comm->size(),
                         "] barrier #1: timed out after ", timeout.count(), " ms: rank ", last,
                         " is in recv #1"));
}

namespace {

// Prints an error and ends the job: MPI_Finalize would wait for a peer that may never come.
[[noreturn]] void report_and_abort(const MpiRuntime& runtime, const tessera::Error& e) {
  std::fprintf(stderr, "mpi_comm_ranks: %s\n", e.what());
  std::fflush(stderr);
  runtime.abort(1);
}

// --fault=skip|exit: rank 1 leaves (skip: returns from main and finalizes MPI; exit:
// _Exit without finalizing) while the other ranks call barrier #1 with a 2 s timeout and
// must fail with a message naming the group, the op and its sequence number.
// --fault=late: rank 1 reaches mpi_world 3 s after the others, whose timeout is 1 s.
int run_fault(const MpiRuntime& runtime, std::string_view mode) {
  if (mode != "skip" && mode != "exit" && mode != "late") {
    std::fprintf(stderr,
                 "mpi_comm_ranks: expected --fault=skip, exit or late, found --fault=%.*s\n",
                 static_cast<int>(mode.size()), mode.data());
    return 2;
  }
  if (mode == "late") {
    if (runtime.world_rank() == 1) std::this_thread::sleep_for(3s);
    try {
      tessera::parallel::mpi_world(runtime, CommOptions{1s});
    } catch (const tessera::Error& e) {
      report_and_abort(runtime, e);
    }
    std::fprintf(stderr, "mpi_comm_ranks: mpi_world completed without the late rank\n");
    return 1;
  }
  auto world = tessera::parallel::mpi_world(runtime, CommOptions{2s});
  world->barrier();  // #0: everyone is here
  if (world->rank() == 1) {
    if (mode == "exit") std::_Exit(0);
    return 0;
  }
  try {
    world->barrier();
  } catch (const tessera::Error& e) {
    report_and_abort(runtime, e);
  }
  std::fprintf(stderr, "mpi_comm_ranks: rank %d: barrier #1 completed without rank 1\n",
               world->rank());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime runtime(&argc, &argv);
  the_runtime = &runtime;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--fault=")) return run_fault(runtime, arg.substr(8));
    args.push_back(argv[i]);
  }
  return Catch::Session().run(static_cast<int>(args.size()), args.data());
}
