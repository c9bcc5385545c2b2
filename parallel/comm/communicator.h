// Communicator: one rank's view of a process group; every parallel mode talks through one,
// passed explicitly (no global default group).
//
// Note [Communicator contract]
// Every rank of a group calls the same collectives in the same order with matching sizes
// and dtypes, on whole contiguous tensors. Outputs are written through the tensor handles
// (like Tensor::copy_), so callers pass views of their own buffers; the in and out of one
// operation must not overlap. Reductions give every
// rank bitwise identical results, so replicas that start equal stay equal. A collective
// whose peers do not all arrive within CommOptions::timeout fails on every rank that
// waits with an error naming the group, the op and its sequence number (and, on the thread
// and MPI backends, the ranks that had not arrived), and the group is
// broken from then on: later calls fail at once instead of pairing with the wrong peers.
//
// The public methods validate their arguments and count calls and bytes (CommStats); the
// backends (thread, MPI, NCCL) implement the protected do_* methods.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "core/tensor.h"

namespace tessera::parallel {

enum class ReduceOp { sum, max, min };

// The operations a Communicator counts, in CommStats order.
enum class CommOp : int {
  all_reduce,
  reduce_scatter,
  all_gather,
  all_to_all,
  broadcast,
  send,
  recv,
  barrier,
  split,
};
inline constexpr int kNumCommOps = 9;

const char* comm_op_name(CommOp op);
const char* reduce_op_name(ReduceOp op);

struct CommOptions {
  // How long a rank waits for its peers in one operation before the operation fails.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
};

// A network link each rank of a group is modeled to sit behind, so the effect of a slow
// network (and of compressing what crosses it) shows on one machine (Note [Simulated
// link]). A bandwidth of 0 switches the model off.
struct SimulatedLink {
  double gbit_per_s = 0;  // per rank and direction, in 1e9 bits per second; 0: no model
  double latency_us = 0;  // per message of a ring algorithm's sequence, in microseconds
  bool enabled() const { return gbit_per_s > 0; }
  // Seconds that `steps` sequential messages carrying `bytes` in all take on this link:
  // latency_us * 1e-6 * steps + bytes * 8 / (gbit_per_s * 1e9); 0 when not enabled().
  double seconds(int64_t bytes, int64_t steps) const;
};

// The sequential messages of a ring algorithm for `op` in a group of `size` ranks: 2(N-1)
// for all_reduce; N-1 for reduce_scatter, all_gather and all_to_all; 1 for broadcast, send
// and recv; 0 for barrier, split and any op in a group of one.
int64_t ring_steps(CommOp op, int size);

// Calls, bytes sent and simulated link time per op on one rank.
//
// Note [Bytes sent]
// Bytes are the volume a bandwidth-optimal (ring) algorithm sends from this rank, the
// number ZeRO's analysis uses, whatever the backend does internally: all_reduce 2(N-1)/N
// x the tensor's bytes, reduce_scatter and all_to_all (N-1)/N x the input's, all_gather
// (N-1)/N x the output's, broadcast the tensor's bytes on the root, send the tensor's
// bytes; recv, barrier and split send nothing.
class CommStats {
 public:
  struct Op {
    int64_t calls = 0;
    int64_t bytes_sent = 0;
    // The time the simulated link took for these calls (Note [Simulated link]).
    double simulated_seconds = 0;
  };
  const Op& operator[](CommOp op) const { return ops_[static_cast<int>(op)]; }
  void add(CommOp op, int64_t bytes_sent, double simulated_seconds = 0);
  // Adds every op's calls, bytes and link time of `other`.
  void add(const CommStats& other);
  int64_t total_bytes_sent() const;
  // The modeled link time of every op; 0 while no simulated link is set.
  double total_simulated_seconds() const;
  // One line per op that was called: "all_reduce: 12 calls, 3.40 MB sent", followed by
  // ", 0.272 s on the simulated link" when that op had a modeled link time.
  std::string summary() const;

 private:
  std::array<Op, kNumCommOps> ops_{};
};

// Note [Device-queued operations]
// NCCL runs an operation on a CUDA stream of its communicator's: the call can return once
// the operation is queued, and the device orders it with the computation by events, so
// neither the host nor the compute stream waits for the network until the result is used
// (torch.distributed's async_op=True on NCCL). Communicator::queue() runs operations that
// way where the backend can (NCCL) and returns the QueuedWork to finish them; every other
// backend runs them to completion and returns null. The operations keep the contract's
// order, validation and byte counts; their completion, errors and timeout are QueuedWork's:
// - order_device_after() makes the device's later work (the compute stream) wait for the
//   operations on the device; the host goes on. The results may be used by kernels
//   queued from then on, and the tensors dropped (memory freed is reused only by work
//   ordered after them).
// - wait() waits on the host, under CommOptions::timeout from the queueing, polling the
//   device and NCCL's asynchronous error, and fails as the blocking call would (the group
//   is broken, the NCCL communicator aborted). Something must call it before the host
//   reads a result or the run ends: AsyncCollectives::wait_all() does, at the defined
//   points where a step settles its communication.
// - With a simulated link, each queued operation's modeled time is slept on the host when
//   it is queued (Note [Simulated link] models host backends; it serializes NCCL's).
// Operations of several communicators queued at once run concurrently on their streams;
// NCCL requires their kernels to fit on the device together (its documentation on using
// several communicators concurrently), which Tessera's few groups per rank do.
class QueuedWork {
 public:
  virtual ~QueuedWork() = default;
  // The device's later work waits for the queued operations; the host does not.
  virtual void order_device_after() = 0;
  // Whether the operations have finished on the device (a poll).
  virtual bool finished() = 0;
  // Waits until they have finished, or fails as a blocking operation would.
  virtual void wait() = 0;
};

// Note [Simulated link]
// With set_simulated_link(), every operation of a group of two or more ranks lasts at least
// as long as its traffic takes on a link of the given bandwidth and latency. Each rank has
// its own full-duplex link, as each GPU or node has its own NIC, and collectives are
// modeled as ring algorithms: an operation of `steps` sequential messages (ring_steps())
// moving `bytes` through this rank's link takes
//     latency_us * 1e-6 * steps + bytes * 8 / (gbit_per_s * 1e9)
// seconds, where bytes are those of Note [Bytes sent], or, for a rank that only receives
// (recv, and broadcast on a non-root rank), the bytes it receives: data cannot arrive
// faster than its sender's link puts it out. The link carries one operation at a time,
// from when the operation was issued or the link finished the one before, whichever is
// later, and a recv no earlier than its message was there (the backend returned: a recv
// started ahead of its send gets the data a link time after the send, not at once); the
// operation ends when the link is done with it or when the backend returned,
// whichever is later, and the rank sleeps until then. So the real elapsed time (the
// backend's work and any wait for peers) counts toward the modeled time, and on one
// machine the delay is that of the simulated network rather than in addition to the
// in-memory copy. An operation an AsyncCollectives worker runs was issued when it was
// started (set_issued_at): the link does not wait for the worker thread to wake, as a NIC
// or NCCL's kernels go on without the host, so on a busy machine a late wake-up is not
// added to every operation of a backlog. Ranks sleep concurrently: a run with one
// thread per rank sees the delay once per collective, not once per rank. A rank that
// arrives early counts its wait for late peers as link time, so under skew the model is a
// lower bound for the early ranks and exact for the last to arrive, which sets the pace.
// CommStats records the modeled seconds per op, so a benchmark can report the time the
// network would have taken next to the bytes it moved.
class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The group's name in errors and logs: "world", or the parent's name and the split color.
  const std::string& name() const { return name_; }
  const CommOptions& options() const { return options_; }
  // Operations issued so far on this rank (the sequence number of the next one).
  int64_t sequence() const { return sequence_; }
  // A copy: an AsyncCollectives worker may be adding to them (of the operations finished
  // so far).
  CommStats stats() const;
  void reset_stats();
  // Counts `stats` as this group's: the operations of a group split off to carry some of
  // this one's traffic (a pipeline's lanes, Note [Pipe lanes] in parallel/pipeline/lanes.h).
  void add_stats(const CommStats& stats);
  // Models this rank's network link from the next operation on (Note [Simulated link]);
  // groups split off later inherit it. Throws on a negative or non-finite value, or on a
  // latency without a bandwidth (gbit_per_s 0 switches the model off).
  void set_simulated_link(const SimulatedLink& link);
  const SimulatedLink& simulated_link() const { return link_; }
  // The next operation was issued at `t`, before it is called: an AsyncCollectives worker
  // runs operations started earlier (Note [Simulated link]). Applies to the next operation
  // only, and only to the simulated link's timing.
  void set_issued_at(std::chrono::steady_clock::time_point t) { issued_at_ = t; }
  // Makes this rank's operations now waiting for peers, on any thread, and all later ones
  // fail with "cancelled: <reason>", which breaks the group: for a rank that will not go on
  // with what it started (a pipeline's receives started ahead, after its stage failed).
  // Thread-safe. MPI's operations and thread ranks' sends and receives stop waiting within
  // a few milliseconds; the rest (thread ranks' collectives, NCCL, host staging) run on to
  // their timeout.
  void cancel(const std::string& reason);
  // Whether the operations may run on a thread other than the one that made the group, one
  // thread at a time (Note [Asynchronous collectives] in async_collectives.h).
  virtual bool runs_on_any_thread() const { return true; }
  // Runs `ops`, calls of this communicator's operations, leaving them queued on the device
  // where the backend can (NCCL): returns the work that finishes them, or null when they
  // have finished (every other backend). Note [Device-queued operations]. The QueuedWork
  // must not outlive the communicator.
  virtual std::unique_ptr<QueuedWork> queue(const std::function<void()>& ops);

  // Note [16-bit reductions]
  // f16 and bf16 tensors are reduced with 16-bit values on the wire and f32 arithmetic: an
  // all_to_all gives each rank every rank's copy of its block, the rank sums them in f32 in
  // rank order and rounds once, and (for all_reduce) an all_gather returns the blocks. The
  // bytes sent are those of a ring reduction ((N-1)/N of the tensor per phase), every
  // element is rounded once (a ring rounds at each of its N-1 hops, and MPI has no 16-bit
  // arithmetic at all), and the result is the same bits on every backend and rank. A
  // failure inside one names the all_to_all or all_gather it is made of. This is the path
  // for CPU tensors; a backend with 16-bit reductions of its own (NCCL, which sums in the
  // 16-bit format along its ring; host staging, whose inner backend takes this path on the
  // host copies) gets them as any other dtype. ZeRO reduces gradients in DeepSpeed's
  // communication_data_type with them (Note [Mixed precision] in zero_optimizer.h).
  //
  // t (any shape) = op over the ranks of t, in place.
  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum);
  // out (n) = block `rank` of op over the ranks of in (size * n).
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::sum);
  // out (size * n): block r is rank r's in (n).
  void all_gather(const Tensor& in, const Tensor& out);
  // in, out (size * n): block j of in goes to rank j; block i of out came from rank i.
  void all_to_all(const Tensor& in, const Tensor& out);
  // t (any shape) = root's t.
  void broadcast(const Tensor& t, int root);
  // Point to point: each send to dst pairs with dst's recv from this rank, in order.
  void send(const Tensor& t, int dst);
  void recv(const Tensor& t, int src);
  void barrier();
  // Splits the group as MPI_Comm_split does: ranks with the same color form a new group,
  // ordered by (key, rank). A negative color joins no group and gets nullptr. Collective.
  std::unique_ptr<Communicator> split(int color, int key);

 protected:
  Communicator(int rank, int size, std::string name, CommOptions options);

  // "[comm data, rank 1 of 4] all_reduce #17": the prefix of every error of the current
  // operation.
  std::string where(CommOp op) const;
  // Fails the current operation with where(op) and a reason; the group is then broken.
  [[noreturn]] void fail(CommOp op, const std::string& reason);
  // Breaks the group for a failure found outside an operation (a queued one's, found by its
  // QueuedWork): later operations fail at once, and on_broken() runs once.
  void mark_broken(const std::string& reason);

  virtual void do_all_reduce(const Tensor& t, ReduceOp op) = 0;
  virtual void do_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) = 0;
  virtual void do_all_gather(const Tensor& in, const Tensor& out) = 0;
  virtual void do_all_to_all(const Tensor& in, const Tensor& out) = 0;
  virtual void do_broadcast(const Tensor& t, int root) = 0;
  virtual void do_send(const Tensor& t, int dst) = 0;
  virtual void do_recv(const Tensor& t, int src) = 0;
  virtual void do_barrier() = 0;
  virtual std::unique_ptr<Communicator> do_split(int color, int key) = 0;
  // Whether tensors on `device` can be communicated by this backend.
  virtual bool supports(Device device) const = 0;
  // Whether do_all_reduce and do_reduce_scatter take f16 and bf16 tensors themselves;
  // otherwise they take Note [16-bit reductions]' path, on CPU tensors only.
  virtual bool reduces_16_bit() const { return false; }
  // Called once when an operation of this rank fails and the group breaks, with the error.
  virtual void on_broken(const std::string& reason) {}
  // Whether cancel() was called; cancel_reason() says why. Safe on any thread: a backend's
  // waits poll it.
  bool cancel_requested() const { return cancel_requested_.load(std::memory_order_acquire); }
  std::string cancel_reason() const;

 private:
  void check_tensor(CommOp op, const char* arg, const Tensor& t);
  void check_peer(CommOp op, const char* arg, int peer);
  // Reductions take f32, f64, i32, i64 and u8 on every backend, and f16 and bf16 on CPU
  // tensors or where the backend reduces them itself (Note [16-bit reductions]); a bool
  // sum has no bool result.
  void check_reducible(CommOp op, const Tensor& t);
  // The 16-bit all_reduce and reduce_scatter of Note [16-bit reductions].
  void half_all_reduce(const Tensor& t, ReduceOp op);
  void half_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op);
  // in and out of one dtype and device, out.numel() = in.numel() * num / den.
  void check_pair(CommOp op, const Tensor& in, const Tensor& out, int64_t num, int64_t den);
  // Starts an operation (its sequence number) and runs f, which validates, calls the
  // backend and returns the bytes it sent and received; an error from it breaks the group.
  // With a simulated link, the operation then lasts at least the link's time.
  template <class F>
  void run(CommOp op, F&& f);

  int rank_;
  int size_;
  std::string name_;
  CommOptions options_;
  int64_t sequence_ = 0;
  mutable std::mutex stats_mutex_;  // guards stats_
  CommStats stats_;
  SimulatedLink link_;
  // Note [Simulated link]: when the next operation was issued (unset: when it is called),
  // and when the link is done with the operations it was given.
  std::optional<std::chrono::steady_clock::time_point> issued_at_;
  std::chrono::steady_clock::time_point link_free_at_{};
  std::string broken_reason_;
  mutable std::mutex cancel_mutex_;  // guards cancel_reason_
  std::string cancel_reason_;
  std::atomic<bool> cancel_requested_{false};
};

}  // namespace tessera::parallel
