#include "parallel/comm/thread_comm.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "core/dispatch.h"
#include "core/error.h"
#include "core/parallel.h"

namespace tessera::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// How often a send or receive waiting for its peer looks whether it was cancelled.
constexpr std::chrono::milliseconds kCancelCheck{5};

struct Group;

// One direction between two ranks: a sender posts a tensor and waits until the receiver
// has copied it.
struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  const Tensor* pending = nullptr;
  bool taken = false;
};

// What one rank posts for an operation; peers read it between arrival and departure.
struct Post {
  CommOp op = CommOp::barrier;
  int64_t sequence = 0;        // the rank's operation number, for messages
  int64_t collective = 0;      // its collective number: what ranks match on (sends and
                               // receives pair up by themselves, as in MPI)
  const Tensor* in = nullptr;  // the tensor peers read (t, or in)
  int64_t numel = 0;
  DType dtype = DType::f32;
  int root = 0;  // broadcast's root; send's destination; recv's source
  int color = 0, key = 0;
  std::shared_ptr<Group> child;  // split: the new group, posted by its first rank
};

// The state the ranks of one group share.
struct Group {
  explicit Group(int size)
      : size(size), posts(size), channels(new Channel[size * size]), arrived(size, false) {}

  const int size;
  std::vector<Post> posts;              // written by each rank before arrival, read until departure
  std::unique_ptr<Channel[]> channels;  // [src * size + dst]

  std::mutex mu;
  std::condition_variable cv;
  std::vector<bool> arrived;  // in the current rendezvous
  int count = 0;
  int64_t generation = 0;
  std::string failure;  // once set, the group is broken

  // Waits until every rank has called wait_all for this rendezvous; nullopt on success,
  // else why not: a timeout (naming the missing ranks), or another rank's failure.
  std::optional<std::string> wait_all(int rank, Clock::time_point deadline,
                                      std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    if (!failure.empty()) return "another rank failed: " + failure;
    const int64_t my_generation = generation;
    arrived[rank] = true;
    if (++count == size) {
      count = 0;
      std::fill(arrived.begin(), arrived.end(), false);
      ++generation;
      cv.notify_all();
      return std::nullopt;
    }
    while (generation == my_generation && failure.empty()) {
      if (cv.wait_until(lock, deadline) == std::cv_status::timeout && generation == my_generation &&
          failure.empty()) {
        std::string missing;
        for (int r = 0; r < size; ++r) {
          if (!arrived[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
        const std::string reason =
            str_cat("timed out after ", timeout.count(), " ms waiting for rank(s) ", missing,
                    " (exited, or called a different operation)");
        failure = str_cat("rank ", rank, " ", reason);
        cv.notify_all();
        return reason;
      }
    }
    if (generation != my_generation) return std::nullopt;
    return "another rank failed: " + failure;
  }

  void break_with(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu);
    if (failure.empty()) failure = reason;
    cv.notify_all();
  }
};

std::string describe(const Post& p) {
  return str_cat(comm_op_name(p.op), " #", p.sequence, " of ", p.numel, " ", dtype_name(p.dtype));
}

// dst = op(dst, src) elementwise, n elements of dtype.
void reduce_into(void* dst, const void* src, int64_t n, DType dtype, ReduceOp op) {
  dispatch_all(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      T* d = static_cast<T*>(dst);
      const T* s = static_cast<const T*>(src);
      switch (op) {
        case ReduceOp::sum:
          for (int64_t i = 0; i < n; ++i) d[i] += s[i];
          break;
        case ReduceOp::max:
          for (int64_t i = 0; i < n; ++i) d[i] = std::max(d[i], s[i]);
          break;
        case ReduceOp::min:
          for (int64_t i = 0; i < n; ++i) d[i] = std::min(d[i], s[i]);
          break;
      }
    }
  });
}

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<Group> group, int rank, std::string name, CommOptions options)
      : Communicator(rank, group->size, std::move(name), options), group_(std::move(group)) {}

 protected:
  void do_all_reduce(const Tensor& t, ReduceOp op) override {
    Post& me = arrive(CommOp::all_reduce, &t, t.numel(), t.dtype());
    // Each rank reduces every element in rank order into a private buffer: all ranks get
    // the same bits, and no rank writes a buffer that a peer still reads.
    std::vector<char> sum(t.nbytes());
    std::memcpy(sum.data(), group_->posts[0].in->raw_data(), sum.size());
    for (int r = 1; r < size(); ++r) {
      reduce_into(sum.data(), group_->posts[r].in->raw_data(), t.numel(), t.dtype(), op);
    }
    depart(me);
    std::memcpy(t.raw_data(), sum.data(), sum.size());
  }

  void do_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    Post& me = arrive(CommOp::reduce_scatter, &in, in.numel(), in.dtype());
    const size_t block = out.nbytes();
    const size_t offset = block * rank();
    std::memcpy(out.raw_data(), bytes(0) + offset, block);
    for (int r = 1; r < size(); ++r) {
      reduce_into(out.raw_data(), bytes(r) + offset, out.numel(), out.dtype(), op);
    }
    depart(me);
  }

  void do_all_gather(const Tensor& in, const Tensor& out) override {
    Post& me = arrive(CommOp::all_gather, &in, in.numel(), in.dtype());
    const size_t block = in.nbytes();
    for (int r = 0; r < size(); ++r) {
      std::memcpy(static_cast<char*>(out.raw_data()) + block * r, bytes(r), block);
    }
    depart(me);
  }

  void do_all_to_all(const Tensor& in, const Tensor& out) override {
    Post& me = arrive(CommOp::all_to_all, &in, in.numel(), in.dtype());
    const size_t block = in.nbytes() / size();
    for (int r = 0; r < size(); ++r) {
      std::memcpy(static_cast<char*>(out.raw_data()) + block * r, bytes(r) + block * rank(), block);
    }
    depart(me);
  }

  void do_broadcast(const Tensor& t, int root) override {
    Post& me = arrive(CommOp::broadcast, &t, t.numel(), t.dtype(), root);
    if (rank() != root) std::memcpy(t.raw_data(), bytes(root), t.nbytes());
    depart(me);
  }

  // Point to point is a rendezvous of the two ranks only, through a per-pair channel.
  void do_send(const Tensor& t, int dst) override {
    Channel& c = group_->channels[rank() * size() + dst];
    std::unique_lock<std::mutex> lock(c.mu);
    c.pending = &t;
    c.taken = false;
    c.cv.notify_all();
    try {
      wait(lock, c.cv, CommOp::send, dst, [&] { return c.taken; });
    } catch (...) {
      // Timed out or cancelled: `t` is about to go, so no receive may find it afterwards.
      c.pending = nullptr;
      c.cv.notify_all();
      throw;
    }
    c.pending = nullptr;
    c.cv.notify_all();
  }

  void do_recv(const Tensor& t, int src) override {
    Channel& c = group_->channels[src * size() + rank()];
    std::unique_lock<std::mutex> lock(c.mu);
    wait(lock, c.cv, CommOp::recv, src, [&] { return c.pending != nullptr && !c.taken; });
    const bool same = c.pending->numel() == t.numel() && c.pending->dtype() == t.dtype();
    const std::string sent = str_cat(c.pending->numel(), " ", dtype_name(c.pending->dtype()));
    if (same) std::memcpy(t.raw_data(), c.pending->raw_data(), t.nbytes());
    c.taken = true;  // releases the sender either way
    c.cv.notify_all();
    if (!same) {
      fail(CommOp::recv,
           str_cat("expected ", t.numel(), " ", dtype_name(t.dtype()), ", the sender sent ", sent));
    }
  }

  void do_barrier() override { depart(arrive(CommOp::barrier, nullptr, 0, DType::f32)); }

  std::unique_ptr<Communicator> do_split(int color, int key) override {
    Post& me = arrive(CommOp::split, nullptr, 0, DType::f32, 0, color, key);
    // Members of my color ordered by (key, rank); the first creates the shared state.
    std::vector<int> members;
    for (int r = 0; r < size(); ++r) {
      if (color >= 0 && group_->posts[r].color == color) members.push_back(r);
    }
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return group_->posts[a].key < group_->posts[b].key; });
    if (!members.empty() && members.front() == rank()) {
      me.child = std::make_shared<Group>(static_cast<int>(members.size()));
    }
    depart(me);  // every child is posted
    std::shared_ptr<Group> child;
    if (!members.empty()) child = group_->posts[members.front()].child;
    depart(me);  // every rank has taken its child; posts may change again
    me.child.reset();
    if (!child) return nullptr;
    const int new_rank =
        static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
    return std::make_unique<ThreadCommunicator>(std::move(child), new_rank,
                                                str_cat(name(), ":", color), options());
  }

  bool supports(Device device) const override { return device.type == DeviceType::cpu; }

  // Peers blocked in a rendezvous fail at once instead of waiting for the timeout.
  void on_broken(const std::string& reason) override {
    group_->break_with(str_cat("rank ", rank(), ": ", reason));
  }

 private:
  // Waits for point-to-point peer `peer` until `ready`.
  template <class Pred>
  void wait(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, CommOp op, int peer,
            Pred ready) {
    const Clock::time_point deadline = Clock::now() + options().timeout;
    while (!ready()) {
      if (cancel_requested()) fail(op, str_cat("cancelled: ", cancel_reason()));
      // Wakes every kCancelCheck to see whether the wait was cancelled (Communicator::cancel).
      const Clock::time_point wake = std::min(deadline, Clock::now() + kCancelCheck);
      if (cv.wait_until(lock, wake) == std::cv_status::timeout && !ready() &&
          Clock::now() >= deadline) {
        fail(op, str_cat("timed out after ", options().timeout.count(), " ms waiting for rank ",
                         peer, " (exited, or called a different operation)"));
      }
    }
  }

  const char* bytes(int r) const {
    return static_cast<const char*>(group_->posts[r].in->raw_data());
  }

  // Posts this rank's operation, waits for every rank and checks they all match.
  Post& arrive(CommOp op, const Tensor* in, int64_t numel, DType dtype, int root = 0, int color = 0,
               int key = 0) {
    Post& me = group_->posts[rank()];
    me.op = op;
    me.sequence = sequence() - 1;
    me.collective = collectives_++;
    me.in = in;
    me.numel = numel;
    me.dtype = dtype;
    me.root = root;
    me.color = color;
    me.key = key;
    rendezvous(op);
    for (int r = 0; r < size(); ++r) {
      const Post& p = group_->posts[r];
      const bool same = p.op == op && p.collective == me.collective && p.numel == numel &&
                        p.dtype == dtype && (op != CommOp::broadcast || p.root == root);
      if (!same) {
        fail(op, str_cat("ranks disagree: rank ", r, " called ", describe(p),
                         op == CommOp::broadcast ? str_cat(" from root ", p.root) : "",
                         ", this rank ", describe(me)));
      }
    }
    return me;
  }

  void depart(Post& me) { rendezvous(me.op); }

  void rendezvous(CommOp op) {
    const Clock::time_point deadline = Clock::now() + options().timeout;
    if (std::optional<std::string> error = group_->wait_all(rank(), deadline, options().timeout)) {
      fail(op, *error);
    }
  }

  std::shared_ptr<Group> group_;
  int64_t collectives_ = 0;  // collectives this rank has entered
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_thread_group(int size, CommOptions options) {
  TS_CHECK(size >= 1, "[comm] expected a group of at least 1 rank, found ", size);
  auto group = std::make_shared<Group>(size);
  std::vector<std::unique_ptr<Communicator>> ranks;
  for (int r = 0; r < size; ++r) {
    ranks.push_back(std::make_unique<ThreadCommunicator>(group, r, "world", options));
  }
  return ranks;
}

void run_thread_ranks(int size, const std::function<void(Communicator&)>& fn, CommOptions options) {
  std::vector<std::unique_ptr<Communicator>> comms = make_thread_group(size, options);
  std::vector<std::exception_ptr> errors(size);
  std::vector<std::thread> threads;
  // OpenMP's thread count is per thread, and a new thread starts from the process default
  // (OMP_NUM_THREADS, or every core), not from what its creator set: each rank takes the
  // caller's.
  const int omp_threads = num_threads();
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        set_num_threads(omp_threads);
        fn(*comms[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace tessera::parallel
