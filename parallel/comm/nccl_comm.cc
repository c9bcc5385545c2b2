#include "parallel/comm/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include "core/cuda_runtime.h"
#include "core/error.h"
#include "core/factories.h"

namespace tessera::parallel {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
    case DType::boolean:
      return ncclUint8;
  }
  TS_FAIL("[comm nccl] no NCCL type for dtype ", dtype_name(dtype));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  TS_FAIL("[comm nccl] unknown reduction");
}

// Throws naming the call when a CUDA runtime call failed outside an operation.
void cuda_check(cudaError_t status, const char* call, int device) {
  TS_CHECK(status == cudaSuccess, "[comm nccl] ", call, " failed on cuda:", device, ": ",
           cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int device, int rank, int size, std::string name,
                   CommOptions options)
      : Communicator(rank, size, std::move(name), options), comm_(comm), device_(device) {
    cuda_check(cudaSetDevice(device_), "cudaSetDevice", device_);
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags", device_);
    cuda_check(cudaEventCreateWithFlags(&queued_, cudaEventDisableTiming), "cudaEventCreate",
               device_);
    barrier_ = zeros({1}, {DType::f32, Device::cuda(device_)});
  }

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (comm_ != nullptr) ncclCommDestroy(comm_);  // null once aborted
    cudaEventDestroy(queued_);
    cudaStreamDestroy(stream_);
  }

 protected:
  void do_all_reduce(const Tensor& t, ReduceOp op) override {
    launch(CommOp::all_reduce, "ncclAllReduce", [&] {
      return ncclAllReduce(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()),
                           nccl_dtype(t.dtype()), nccl_op(op), comm_, stream_);
    });
  }

  void do_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    launch(CommOp::reduce_scatter, "ncclReduceScatter", [&] {
      return ncclReduceScatter(in.raw_data(), out.raw_data(), static_cast<size_t>(out.numel()),
                               nccl_dtype(in.dtype()), nccl_op(op), comm_, stream_);
    });
  }

  void do_all_gather(const Tensor& in, const Tensor& out) override {
    launch(CommOp::all_gather, "ncclAllGather", [&] {
      return ncclAllGather(in.raw_data(), out.raw_data(), static_cast<size_t>(in.numel()),
                           nccl_dtype(in.dtype()), comm_, stream_);
    });
  }

  void do_all_to_all(const Tensor& in, const Tensor& out) override {
    const int64_t n = in.numel() / size();
    launch(CommOp::all_to_all, "ncclSend/ncclRecv", [&] {
      ncclResult_t r = ncclGroupStart();
      for (int peer = 0; peer < size() && r == ncclSuccess; ++peer) {
        r = ncclSend(in.narrow(0, peer * n, n).raw_data(), static_cast<size_t>(n),
                     nccl_dtype(in.dtype()), peer, comm_, stream_);
        if (r == ncclSuccess) {
          r = ncclRecv(out.narrow(0, peer * n, n).raw_data(), static_cast<size_t>(n),
                       nccl_dtype(out.dtype()), peer, comm_, stream_);
        }
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }

  void do_broadcast(const Tensor& t, int root) override {
    launch(CommOp::broadcast, "ncclBroadcast", [&] {
      return ncclBroadcast(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()),
                           nccl_dtype(t.dtype()), root, comm_, stream_);
    });
  }

  void do_send(const Tensor& t, int dst) override {
    launch(CommOp::send, "ncclSend", [&] {
      return ncclSend(t.raw_data(), static_cast<size_t>(t.numel()), nccl_dtype(t.dtype()), dst,
                      comm_, stream_);
    });
  }

  void do_recv(const Tensor& t, int src) override {
    launch(CommOp::recv, "ncclRecv", [&] {
      return ncclRecv(t.raw_data(), static_cast<size_t>(t.numel()), nccl_dtype(t.dtype()), src,
                      comm_, stream_);
    });
  }

  void do_barrier() override {
    launch(CommOp::barrier, "ncclAllReduce", [&] {
      return ncclAllReduce(barrier_.raw_data(), barrier_.raw_data(), 1, ncclFloat32, ncclSum, comm_,
                           stream_);
    });
  }

  std::unique_ptr<Communicator> do_split(int color, int key) override {
    constexpr CommOp op = CommOp::split;
    // Everything queued before the split is done first (ncclCommSplit blocks anyway).
    launch(op, "cudaStreamSynchronize", [] { return ncclSuccess; });
    ncclComm_t child = nullptr;
    check(op, "ncclCommSplit",
          ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, nullptr));
    if (child == nullptr) return nullptr;
    int rank = 0;
    int count = 0;
    check(op, "ncclCommUserRank", ncclCommUserRank(child, &rank));
    check(op, "ncclCommCount", ncclCommCount(child, &count));
    return std::make_unique<NcclCommunicator>(child, device_, rank, count,
                                              str_cat(name(), ":", color), options());
  }

  bool supports(Device device) const override {
    return device.is_cuda() && device.index == device_;
  }
  bool reduces_16_bit() const override { return true; }  // ncclFloat16, ncclBfloat16
  // Its device belongs to the thread that made it; it overlaps by queueing instead (Note
  // [Device-queued operations] in communicator.h).
  bool runs_on_any_thread() const override { return false; }

  std::unique_ptr<QueuedWork> queue(const std::function<void()>& ops) override {
    last_queued_.reset();
    queue_only_ = true;
    try {
      ops();
    } catch (...) {
      queue_only_ = false;
      throw;
    }
    queue_only_ = false;
    if (!last_queued_) return nullptr;  // nothing reached the device (a group of one)
    try {
      auto work = std::make_unique<Work>(*this, *last_queued_);
      check_cuda(last_queued_->op, "cudaEventRecord", cudaEventRecord(work->done(), stream_));
      return work;
    } catch (const Error& e) {
      mark_broken(e.what());  // the operations are queued, and nothing could wait for them
      throw;
    }
  }

  void on_broken(const std::string&) override { abort(); }

 private:
  // Fails `op` when an NCCL call returned an error, with NCCL's message.
  void check(CommOp op, const char* call, ncclResult_t result) {
    if (result == ncclSuccess) return;
    const char* last = ncclGetLastError(comm_);
    fail(op, str_cat(call, " failed: ", ncclGetErrorString(result),
                     last != nullptr && *last != '\0' ? str_cat(" (", last, ")") : ""));
  }

  void check_cuda(CommOp op, const char* call, cudaError_t status) {
    if (status == cudaSuccess) return;
    fail(op, str_cat(call, " failed: ", cudaGetErrorName(status), " (", cudaGetErrorString(status),
                     ")"));
  }

  // An operation left on the stream by queue(): what its errors name, and its deadline.
  struct Queued {
    CommOp op;
    const char* call;
    int64_t sequence;  // the operation's number, as where() gives it
    Clock::time_point deadline;
  };

  // The QueuedWork of queue(): an event recorded on the stream after the operations.
  class Work final : public QueuedWork {
   public:
    Work(NcclCommunicator& comm, const Queued& last) : comm_(comm), last_(last) {
      comm_.check_cuda(last_.op, "cudaEventCreateWithFlags",
                       cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    }
    ~Work() override {
      cudaSetDevice(comm_.device_);
      cudaEventDestroy(done_);  // the device releases it once it has passed
    }
    cudaEvent_t done() const { return done_; }

    void order_device_after() override {
      breaking_on_error([this] {
        comm_.check_not_aborted(last_);
        comm_.check_cuda(last_.op, "cudaSetDevice", cudaSetDevice(comm_.device_));
        comm_.check_cuda(last_.op, "cudaStreamWaitEvent",
                         cudaStreamWaitEvent(cudaStreamLegacy, done_, 0));
      });
    }
    bool finished() override {
      cudaSetDevice(comm_.device_);
      return cudaEventQuery(done_) == cudaSuccess;
    }
    void wait() override {
      breaking_on_error([this] {
        comm_.check_not_aborted(last_);
        comm_.check_cuda(last_.op, "cudaSetDevice", cudaSetDevice(comm_.device_));
        comm_.await(
            last_.op, str_cat("the queued ", last_.call, " #", last_.sequence),
            [this] { return cudaEventQuery(done_); }, last_.deadline);
      });
    }

   private:
    // Runs `f`; an error breaks the group, which aborts the NCCL communicator (so kernels
    // stuck waiting for a peer end, and the events behind them pass), then propagates.
    template <class F>
    void breaking_on_error(F&& f) {
      try {
        f();
      } catch (const Error& e) {
        comm_.mark_broken(e.what());
        throw;
      }
    }

    NcclCommunicator& comm_;
    Queued last_;
    cudaEvent_t done_ = nullptr;
  };

  // Enqueues `call` after the work on the legacy default stream, then, unless queue() is
  // running, waits for it under the deadline (Note [NCCL waits under a deadline]).
  template <class F>
  void launch(CommOp op, const char* name, F&& call) {
    check_cuda(op, "cudaSetDevice", cudaSetDevice(device_));
    check_cuda(op, "cudaEventRecord", cudaEventRecord(queued_, cudaStreamLegacy));
    check_cuda(op, "cudaStreamWaitEvent", cudaStreamWaitEvent(stream_, queued_, 0));
    check(op, name, call());
    const Clock::time_point deadline = Clock::now() + options().timeout;
    if (queue_only_) {
      last_queued_ = Queued{op, name, sequence() - 1, deadline};
      return;
    }
    await(
        op, name, [this] { return cudaStreamQuery(stream_); }, deadline);
  }

  // Fails when the NCCL communicator was aborted after `queued` was queued: its kernels
  // were ended, so its event has passed without results.
  void check_not_aborted(const Queued& queued) {
    if (comm_ != nullptr) return;
    fail(queued.op, str_cat("the queued ", queued.call, " #", queued.sequence,
                            " did not complete: the NCCL communicator was aborted by a later "
                            "failure of the group"));
  }

  // Polls `query` (cudaSuccess: done) and NCCL's asynchronous error until done; fails `op`,
  // naming `what`, on an error or when `deadline` passes.
  template <class Query>
  void await(CommOp op, const std::string& what, Query&& query, Clock::time_point deadline) {
    auto pause = std::chrono::microseconds(10);
    for (;;) {
      const cudaError_t done = query();
      if (done == cudaSuccess) return;
      if (done != cudaErrorNotReady) check_cuda(op, "cudaEventQuery/cudaStreamQuery", done);
      ncclResult_t async = ncclSuccess;
      check(op, "ncclCommGetAsyncError", ncclCommGetAsyncError(comm_, &async));
      check(op, what.c_str(), async);
      if (Clock::now() > deadline) {
        fail(op, str_cat("timed out after ", options().timeout.count(), " ms waiting for peers (",
                         what, " did not complete; the NCCL communicator is aborted)"));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  // Ends the NCCL communicator: kernels waiting for peers return, later calls fail.
  void abort() {
    if (comm_ == nullptr) return;
    cudaSetDevice(device_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  ncclComm_t comm_;
  int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t queued_ = nullptr;
  Tensor barrier_;                     // (1) on the device
  bool queue_only_ = false;            // inside queue(): launch() does not wait
  std::optional<Queued> last_queued_;  // the last operation launch() left queued
};

}  // namespace

std::unique_ptr<Communicator> nccl_group(Communicator& bootstrap, int device, CommOptions options) {
  cuda::check_device(device);
  cuda_check(cudaSetDevice(device), "cudaSetDevice", device);
  // Rank 0's unique id, as bytes, to every rank over the CPU group.
  const Tensor id_bytes = zeros({static_cast<int64_t>(sizeof(ncclUniqueId))}, {DType::u8});
  ncclUniqueId id;
  if (bootstrap.rank() == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    TS_CHECK(r == ncclSuccess, "[comm nccl] ncclGetUniqueId failed: ", ncclGetErrorString(r));
    std::memcpy(id_bytes.raw_data(), &id, sizeof(id));
  }
  bootstrap.broadcast(id_bytes, 0);
  std::memcpy(&id, id_bytes.raw_data(), sizeof(id));
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank());
  TS_CHECK(r == ncclSuccess, "[comm nccl] rank ", bootstrap.rank(), " of ", bootstrap.size(),
           " on cuda:", device, ": ncclCommInitRank failed: ", ncclGetErrorString(r),
           " (NCCL needs one GPU per rank)");
  return std::make_unique<NcclCommunicator>(comm, device, bootstrap.rank(), bootstrap.size(),
                                            "nccl", options);
}

}  // namespace tessera::parallel
