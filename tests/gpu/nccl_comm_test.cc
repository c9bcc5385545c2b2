// The NCCL backend on real GPUs: every collective against values computed on the CPU, on
// as many thread ranks as there are GPUs (up to 4; one GPU gives a 1-rank group, which
// still runs every NCCL call), bootstrapped over the thread backend. With two or more GPUs,
// a rank that skips a collective makes its peer fail within the timeout.
#include "parallel/comm/nccl_comm.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "parallel/comm/thread_comm.h"

namespace tessera::parallel {
namespace {

int gpu_ranks() { return std::min(cuda::device_count(), 4); }

// values of rank r: r * 100 + i, i < n, as f32 on the CPU.
Tensor rank_values(int r, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(r * 100 + i);
  return from_vector(v, {n});
}

std::vector<float> on_cpu(const Tensor& t) { return t.to(Device::cpu()).to_vector<float>(); }

TEST_CASE("NCCL collectives give what the CPU computes", "[gpu][nccl]") {
  const int world = gpu_ranks();
  REQUIRE(world >= 1);
  // Per rank: a description of every mismatch (Catch2 asserts only on the main thread).
  std::vector<std::string> problems(static_cast<size_t>(world));
  run_thread_ranks(world, [&](Communicator& cpu) {
    const int r = cpu.rank();
    const Device dev = Device::cuda(r);
    std::unique_ptr<Communicator> nccl = nccl_group(cpu, r, {});
    std::string& bad = problems[static_cast<size_t>(r)];
    auto expect = [&](const std::string& what, const std::vector<float>& got,
                      const std::vector<float>& want) {
      if (got != want) bad += what + " differs; ";
    };
    const int64_t n = 6;
    // all_reduce: sum and max over ranks.
    Tensor t = rank_values(r, n).to(dev);
    nccl->all_reduce(t);
    std::vector<float> sum(n, 0.0f), max(n);
    for (int q = 0; q < world; ++q) {
      for (int64_t i = 0; i < n; ++i) sum[i] += static_cast<float>(q * 100 + i);
    }
    for (int64_t i = 0; i < n; ++i) max[i] = static_cast<float>((world - 1) * 100 + i);
    expect("all_reduce sum", on_cpu(t), sum);
    t = rank_values(r, n).to(dev);
    nccl->all_reduce(t, ReduceOp::max);
    expect("all_reduce max", on_cpu(t), max);
    // reduce_scatter of (world * n): block r of the sum.
    const Tensor rs_in = rank_values(r, world * n).to(dev);
    const Tensor rs_out = empty({n}, {DType::f32, dev});
    nccl->reduce_scatter(rs_in, rs_out);
    std::vector<float> block(n, 0.0f);
    for (int q = 0; q < world; ++q) {
      for (int64_t i = 0; i < n; ++i) block[i] += static_cast<float>(q * 100 + r * n + i);
    }
    expect("reduce_scatter", on_cpu(rs_out), block);
    // all_gather: block q is rank q's values.
    const Tensor ag_out = empty({world * n}, {DType::f32, dev});
    nccl->all_gather(rank_values(r, n).to(dev), ag_out);
    std::vector<float> gathered;
    for (int q = 0; q < world; ++q) {
      for (float v : rank_values(q, n).to_vector<float>()) gathered.push_back(v);
    }
    expect("all_gather", on_cpu(ag_out), gathered);
    // all_to_all: block q of the output is block r of rank q's input.
    const Tensor a2a_out = empty({world * n}, {DType::f32, dev});
    nccl->all_to_all(rank_values(r, world * n).to(dev), a2a_out);
    std::vector<float> swapped;
    for (int q = 0; q < world; ++q) {
      for (int64_t i = 0; i < n; ++i) swapped.push_back(static_cast<float>(q * 100 + r * n + i));
    }
    expect("all_to_all", on_cpu(a2a_out), swapped);
    // broadcast from the last rank, in f64.
    const Tensor b = rank_values(r, n).to(DType::f64).to(dev);
    nccl->broadcast(b, world - 1);
    expect("broadcast", b.to(Device::cpu()).to(DType::f32).to_vector<float>(),
           rank_values(world - 1, n).to_vector<float>());
    // send/recv around a ring.
    if (world > 1) {
      const Tensor got = empty({n}, {DType::f32, dev});
      if (r % 2 == 0) {
        nccl->send(rank_values(r, n).to(dev), (r + 1) % world);
        nccl->recv(got, (r + world - 1) % world);
      } else {
        nccl->recv(got, (r + world - 1) % world);
        nccl->send(rank_values(r, n).to(dev), (r + 1) % world);
      }
      expect("recv", on_cpu(got), rank_values((r + world - 1) % world, n).to_vector<float>());
    }
    nccl->barrier();
    // split: even and odd ranks, each sums its own ranks.
    std::unique_ptr<Communicator> half = nccl->split(r % 2, r);
    const Tensor h = full({1}, 1.0, {DType::f32, dev});
    half->all_reduce(h);
    const float members = static_cast<float>((world + (r % 2 == 0 ? 1 : 0)) / 2);
    expect("split all_reduce", on_cpu(h), {members});
    if (half->name() != "nccl:" + std::to_string(r % 2)) bad += "split name " + half->name();
    if (nccl->stats()[CommOp::all_reduce].calls != 2) bad += "all_reduce count; ";
  });
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    CHECK(problems[static_cast<size_t>(r)] == "");
  }
}

TEST_CASE("an NCCL group rejects CPU tensors; a group of one moves nothing", "[gpu][nccl]") {
  const int world = gpu_ranks();
  REQUIRE(world >= 1);
  if (world == 1) {
    // A group of one moves no data, so it takes a tensor on any device and leaves it as is
    // (Note [A group of one], parallel/comm/communicator.cc).
    std::vector<float> result;
    run_thread_ranks(1, [&](Communicator& cpu) {
      std::unique_ptr<Communicator> nccl = nccl_group(cpu, 0, {});
      const Tensor t = full({3}, 2.0);
      nccl->all_reduce(t);
      result = t.to_vector<float>();
    });
    CHECK(result == std::vector<float>{2, 2, 2});
    WARN("one GPU: the rejection of CPU tensors needs a group of two and is skipped");
    return;
  }
  std::vector<std::string> errors(2);
  run_thread_ranks(2, [&](Communicator& cpu) {
    std::unique_ptr<Communicator> nccl = nccl_group(cpu, cpu.rank(), {});
    try {
      nccl->all_reduce(zeros({3}));  // checked before any NCCL call: no rank waits
    } catch (const Error& e) {
      errors[static_cast<size_t>(cpu.rank())] = e.what();
    }
  });
  CHECK_THAT(errors[0], Catch::Contains("[comm nccl, rank 0 of 2] all_reduce #0"));
  CHECK_THAT(errors[1], Catch::Contains("is on cpu"));
}

TEST_CASE("a rank that skips an NCCL collective makes its peer fail within the timeout",
          "[gpu][nccl]") {
  if (gpu_ranks() < 2) {
    WARN("one GPU: NCCL needs a GPU per rank, so the two-rank timeout case is skipped");
    return;
  }
  std::vector<std::string> errors(2);
  CommOptions quick;
  quick.timeout = std::chrono::milliseconds(2000);
  run_thread_ranks(2, [&](Communicator& cpu) {
    std::unique_ptr<Communicator> nccl = nccl_group(cpu, cpu.rank(), quick);
    if (cpu.rank() == 1) return;  // never joins
    try {
      nccl->all_reduce(zeros({4}, {DType::f32, Device::cuda(0)}));
    } catch (const Error& e) {
      errors[0] = e.what();
    }
  });
  CHECK_THAT(errors[0], Catch::Contains("[comm nccl, rank 0 of 2] all_reduce #0: timed out"));
}

// Note [Two NCCL ranks on one GPU]
// A one-GPU machine exercises NCCL's multi-rank path only if two ranks may share a device.
// NCCL checks the ranks' bus ids when a communicator is created and, since 2.5, refuses two
// ranks of one communicator on one GPU ("Duplicate GPU detected") with ncclInvalidUsage,
// whether the ranks are threads or processes. This case records which it is on the NCCL at
// hand: either both ranks reduce correctly, or both fail at creation with NCCL's reason in
// Tessera's error, and neither hangs.
TEST_CASE("two NCCL ranks sharing one GPU reduce correctly or are refused clearly", "[gpu][nccl]") {
  REQUIRE(gpu_ranks() >= 1);
  std::vector<std::string> outcome(2);
  CommOptions quick;
  quick.timeout = std::chrono::milliseconds(20000);
  run_thread_ranks(2, [&](Communicator& cpu) {
    const int r = cpu.rank();
    try {
      std::unique_ptr<Communicator> nccl = nccl_group(cpu, 0, quick);
      Tensor t = rank_values(r, 4).to(Device::cuda(0));
      nccl->all_reduce(t);
      outcome[static_cast<size_t>(r)] =
          on_cpu(t) == std::vector<float>{100, 102, 104, 106} ? "reduced" : "wrong sum";
    } catch (const Error& e) {
      outcome[static_cast<size_t>(r)] = e.what();
    }
  });
  INFO("rank 0: " << outcome[0] << "\nrank 1: " << outcome[1]);
  if (outcome[0] == "reduced") {
    CHECK(outcome[1] == "reduced");
    WARN("this NCCL lets two ranks share one GPU: the multi-rank path ran on one device");
  } else {
    for (const std::string& o : outcome)
      CHECK_THAT(o, Catch::Contains("nccl", Catch::CaseSensitive::No));
    WARN("this NCCL refuses two ranks on one GPU: " << outcome[0]);
  }
}

}  // namespace
}  // namespace tessera::parallel
