// AsyncCollectives: a communicator's collectives started now and waited on later, so a rank
// computes while its tensors travel (torch.distributed's async_op=True).
//
//   AsyncCollectives async(dp);
//   CommHandle h = async.reduce_scatter(bucket, shard);  // returns at once
//   ... backward goes on producing the next bucket ...
//   h.wait();                                             // shard holds the result
//
// Note [Asynchronous collectives]
// - A worker thread of its own runs the operations one at a time in the order they were
//   started, through the communicator's ordinary calls (validation, CommStats, the
//   simulated link's delay, errors), so every rank's sequence still matches (Note
//   [Communicator contract] in communicator.h) and the results are the blocking calls'
//   bits. While any operation is in flight the owner calls nothing on the communicator
//   itself (wait_all() first); other groups it may use, as the backend allows any thread
//   in any group at once. The worker's kernels use the owner's thread count.
// - The caller keeps an operation's tensors as they are until its wait() returns: it does
//   not write the inputs or read the outputs (the handle holds them alive, not constant).
// - An operation's error is rethrown by its wait() and by wait_all(); the group is then
//   broken as after a failed blocking call, so the operations behind it fail too.
// - A backend that must run on the caller's thread (Communicator::runs_on_any_thread()
//   false: NCCL and host staging, whose CUDA calls belong to the caller's device; MPI below
//   MPI_THREAD_MULTIPLE) has no worker: each operation is run through
//   Communicator::queue() when it is started. NCCL leaves it queued on its stream (Note
//   [Device-queued operations] in communicator.h): wait() then makes the compute stream
//   wait for it on the device and returns without waiting on the host, and wait_all()
//   waits on the host, under the group's timeout, so its errors surface there. The other
//   backends run it to completion: the handle is complete on return and nothing overlaps.
// - The communicator's stats() are updated by the worker: read them after wait_all().
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/communicator.h"

namespace tessera::parallel {

// One started operation.
class CommHandle {
 public:
  // A handle with nothing to wait for.
  CommHandle() = default;
  // Blocks until the operation has run, or, queued on a device, orders the device's later
  // work after it; rethrows its error (every time it is called).
  void wait() const;
  // Whether the operation has run (on the device, when queued there).
  bool done() const;
  // Whether the operation has run and failed.
  bool failed() const;

 private:
  friend class AsyncCollectives;
  struct State {
    std::function<void()> run;                      // the blocking call, with its tensors
    std::chrono::steady_clock::time_point started;  // for the simulated link
    // Set when the backend left the operation queued on a device; `run` then keeps its
    // tensors alive for as long as the state lives.
    std::unique_ptr<QueuedWork> queued;
    std::mutex mutex;
    std::condition_variable finished;
    bool done = false;
    std::exception_ptr error;
  };
  explicit CommHandle(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

class AsyncCollectives {
 public:
  // `comm` must outlive this object.
  explicit AsyncCollectives(Communicator& comm);
  // Waits for every started operation (their errors were or are for wait() to report) and
  // stops the worker.
  ~AsyncCollectives();
  AsyncCollectives(const AsyncCollectives&) = delete;
  AsyncCollectives& operator=(const AsyncCollectives&) = delete;

  Communicator& comm() const { return comm_; }
  // Whether started operations run on the worker (else at start: Note [Asynchronous
  // collectives]).
  bool overlaps() const { return worker_.joinable(); }

  // The communicator's operations of the same names and arguments, started.
  CommHandle all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum);
  CommHandle reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::sum);
  CommHandle all_gather(const Tensor& in, const Tensor& out);
  CommHandle send(const Tensor& t, int dst);
  CommHandle recv(const Tensor& t, int src);
  // Waits for every operation started so far, on the host also those queued on a device;
  // rethrows the first error among them (among those not yet dropped: handles of
  // operations that succeeded are dropped as new ones start, so a long run holds only the
  // recent and the failed ones).
  void wait_all();

 private:
  CommHandle start(std::function<void()> run);
  // The worker's loop: runs queued operations until stopped.
  void work();
  // Runs `state`'s operation and records its end and error.
  static void run_one(CommHandle::State& state);
  // Runs `state`'s operation through comm_.queue() and records that it has been started
  // (and its error).
  void queue_one(CommHandle::State& state);
  // `h`'s wait(), then, when it was queued on a device, a wait on the host.
  static void wait_on_host(const CommHandle& h);

  Communicator& comm_;
  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<std::shared_ptr<CommHandle::State>> queue_;  // started, not yet run
  bool stopping_ = false;
  std::vector<CommHandle> started_;  // since the last wait_all()
  std::thread worker_;
};

}  // namespace tessera::parallel
