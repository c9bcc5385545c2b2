// The MPI backend of Communicator (parallel/comm/communicator.h): one process per rank, CPU
// tensors, launched with mpirun. The production CPU and multi-node path.
//
//   int main(int argc, char** argv) {
//     tessera::parallel::MpiRuntime mpi(&argc, &argv);
//     std::unique_ptr<Communicator> world = tessera::parallel::mpi_world(mpi, {});
//     ...  // every communicator is destroyed before `mpi`
//   }
//
// Note [MPI waits under a deadline]
// Every operation is started nonblocking (MPI_Ibcast, MPI_Isend, ...) and then polled with
// MPI_Test until it completes or CommOptions::timeout passes, so that a peer that exited or
// called a different operation becomes an error naming the group, the op and its sequence
// number instead of a hang, and the ranks it was waiting for: the peer of a send or recv,
// and for a collective those a roll call finds missing (Note [Roll call] in
// parallel/comm/mpi_roll_call.h). The poll yields for the first 50 us, in which a small message
// completes (sleeping at once made small collectives 25x slower), then sleeps between
// tests, 10 us doubling up to 1 ms: ranks often outnumber cores, and a busy spin would take
// the CPU from the very peer being waited for. MPI cannot cancel a collective, so the
// buffers of an operation that timed out stay allocated (MPI may still write them) for as
// long as the process runs; the group is broken from then on (Note [Communicator contract]).
#pragma once

#include <memory>

#include "parallel/comm/communicator.h"

namespace tessera::parallel {

// Initializes MPI for the lifetime of the object and finalizes it afterwards. Construct
// one in main() before any MPI communicator and let it outlive them all. When MPI is
// already initialized (by a host program), the runtime neither initializes nor finalizes.
class MpiRuntime {
 public:
  // Calls MPI_Init_thread(MPI_THREAD_FUNNELED): only the thread that constructed the
  // runtime makes MPI calls. MPI may remove its own arguments from argc/argv. Throws when
  // MPI was already finalized or cannot give that thread level. Collective: it finds the
  // ranks of its node with MPI_Comm_split_type.
  MpiRuntime(int* argc, char*** argv);
  // Calls MPI_Finalize if this object initialized MPI.
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  // True when this object called MPI_Init_thread (and so will call MPI_Finalize).
  bool owns_mpi() const { return owns_mpi_; }
  // This process's rank in MPI_COMM_WORLD and the number of processes, known without a
  // communicator (for log tags, or decisions made before the world is created).
  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  // This process's rank among the processes of its node (the GPU a rank drives).
  int local_rank() const { return local_rank_; }
  // True when the process was started by mpirun (OpenMPI) or another PMI launcher, as
  // opposed to a lone process that MPI would run as a singleton world of size 1.
  static bool launched_by_mpirun();
  // Ends every process of the job with `exit_code` (MPI_Abort on MPI_COMM_WORLD). For
  // binaries after they printed an error: MPI_Finalize, run by the destructor, would wait
  // for peers that may be the ones that failed. Library code never calls it.
  [[noreturn]] void abort(int exit_code) const;

 private:
  bool owns_mpi_ = false;
  int world_rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
};

// A Communicator over a duplicate of MPI_COMM_WORLD named "world", so that its traffic
// never pairs with other users of MPI_COMM_WORLD. Its split() gives MPI communicators
// named "<parent>:<color>" that inherit `options`. Collective over all processes: fails
// when one of them has not called it within options.timeout. Use the communicator and its
// splits on the thread that constructed `runtime` only (MPI_THREAD_FUNNELED).
std::unique_ptr<Communicator> mpi_world(const MpiRuntime& runtime, CommOptions options);

}  // namespace tessera::parallel
