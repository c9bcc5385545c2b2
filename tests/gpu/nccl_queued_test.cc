// NCCL operations left queued on their stream (Note [Device-queued operations] in
// parallel/comm/communicator.h) through AsyncCollectives: the device work queued after a
// handle's wait() sees the results, which equal the blocking calls' bits; the host returns
// before the device has finished; and a peer that never joins fails the wait_all() within
// the timeout. Two ranks on two GPUs (NCCL refuses two ranks on one: Note [Two NCCL ranks on
// one GPU] in tests/gpu/nccl_comm_test.cc).
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "core/cuda_runtime.h"
#include "core/factories.h"
#include "parallel/comm/async_collectives.h"
#include "parallel/comm/nccl_comm.h"
#include "parallel/comm/thread_comm.h"

namespace tessera::parallel {
namespace {

bool two_gpus() {
  if (cuda::device_count() >= 2) return true;
  WARN("skipped: queued NCCL operations need two GPUs (one rank each), found "
       << cuda::device_count());
  return false;
}

// Rank r's values: (r + 1) * 0.5 + i / 7, f32, n of them, on `dev`.
Tensor rank_values(int r, int64_t n, Device dev) {
  return (arange(n, {DType::f32}) * (1.0 / 7.0) + (r + 1) * 0.5).to(dev);
}

std::vector<float> on_cpu(const Tensor& t) { return t.to(Device::cpu()).to_vector<float>(); }

TEST_CASE("queued NCCL collectives give the blocking calls' bits to the work after wait()",
          "[gpu][nccl][async]") {
  if (!two_gpus()) return;
  constexpr int64_t kN = 1 << 22;  // 16 MB of f32 per tensor
  std::vector<std::string> problems(2);
  std::vector<int> host_ran_ahead(2, 0);
  run_thread_ranks(2, [&](Communicator& cpu) {
    const int r = cpu.rank();
    const Device dev = Device::cuda(r);
    std::unique_ptr<Communicator> nccl = nccl_group(cpu, r, {});
    std::string& bad = problems[static_cast<size_t>(r)];

    // The blocking calls, each result then doubled on the compute stream.
    const Tensor ar = rank_values(r, kN, dev);
    nccl->all_reduce(ar);
    const Tensor rs = empty({kN / 2}, {DType::f32, dev});
    nccl->reduce_scatter(rank_values(r, kN, dev), rs);
    const Tensor ag = empty({2 * kN}, {DType::f32, dev});
    nccl->all_gather(rank_values(r, kN, dev), ag);
    const Tensor p2p = empty({kN}, {DType::f32, dev});
    if (r == 0) {
      nccl->send(rank_values(r, kN, dev), 1);
      nccl->recv(p2p, 1);
    } else {
      nccl->recv(p2p, 0);
      nccl->send(rank_values(r, kN, dev), 0);
    }
    const std::vector<std::vector<float>> want = {on_cpu(ar * 2.0), on_cpu(rs * 2.0),
                                                  on_cpu(ag * 2.0), on_cpu(p2p * 2.0)};

    // The same, queued: started together, each waited for by the device only.
    AsyncCollectives async(*nccl);
    const Tensor q_ar = rank_values(r, kN, dev);
    const Tensor q_rs = empty({kN / 2}, {DType::f32, dev});
    const Tensor q_ag = empty({2 * kN}, {DType::f32, dev});
    const Tensor q_p2p = empty({kN}, {DType::f32, dev});
    const CommHandle h_ar = async.all_reduce(q_ar);
    const CommHandle h_rs = async.reduce_scatter(rank_values(r, kN, dev), q_rs);
    const CommHandle h_ag = async.all_gather(rank_values(r, kN, dev), q_ag);
    std::vector<CommHandle> h_p2p;
    if (r == 0) h_p2p = {async.send(rank_values(r, kN, dev), 1), async.recv(q_p2p, 1)};
    if (r == 1) h_p2p = {async.recv(q_p2p, 0), async.send(rank_values(r, kN, dev), 0)};
    host_ran_ahead[static_cast<size_t>(r)] = !h_ar.done() || !h_p2p.back().done();
    h_ar.wait();
    const Tensor d_ar = q_ar * 2.0;
    h_rs.wait();
    const Tensor d_rs = q_rs * 2.0;
    h_ag.wait();
    const Tensor d_ag = q_ag * 2.0;
    for (const CommHandle& h : h_p2p) h.wait();
    const Tensor d_p2p = q_p2p * 2.0;
    async.wait_all();
    const std::vector<std::vector<float>> got = {on_cpu(d_ar), on_cpu(d_rs), on_cpu(d_ag),
                                                 on_cpu(d_p2p)};
    const char* names[] = {"all_reduce", "reduce_scatter", "all_gather", "send/recv"};
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != want[i]) bad += std::string(names[i]) + " differs from the blocking call; ";
    }
  });
  CHECK(problems[0].empty());
  CHECK(problems[1].empty());
  INFO(problems[0] << problems[1]);
  if (host_ran_ahead != std::vector<int>{1, 1}) {
    WARN("the device had finished 16 MB collectives before the host looked: no overlap seen");
  }
}

TEST_CASE("a queued NCCL collective whose peer never joins fails wait_all within the timeout",
          "[gpu][nccl][async]") {
  if (!two_gpus()) return;
  std::string error;
  CommOptions quick;
  quick.timeout = std::chrono::milliseconds(2000);
  run_thread_ranks(2, [&](Communicator& cpu) {
    std::unique_ptr<Communicator> nccl = nccl_group(cpu, cpu.rank(), quick);
    if (cpu.rank() == 1) return;  // never joins
    AsyncCollectives async(*nccl);
    const CommHandle h = async.all_reduce(zeros({4}, {DType::f32, Device::cuda(0)}));
    h.wait();  // orders the device only: returns
    try {
      async.wait_all();
    } catch (const Error& e) {
      error = e.what();
    }
  });
  CHECK_THAT(error, Catch::Contains("[comm nccl, rank 0 of 2] all_reduce") &&
                        Catch::Contains("the queued ncclAllReduce #0 did not complete") &&
                        Catch::Contains("timed out after 2000 ms"));
}

}  // namespace
}  // namespace tessera::parallel
