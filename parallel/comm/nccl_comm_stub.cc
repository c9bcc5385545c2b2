// nccl_group() in builds without the CUDA toolkit.
#include "core/error.h"
#include "parallel/comm/nccl_comm.h"

namespace tessera::parallel {

std::unique_ptr<Communicator> nccl_group(Communicator&, int device, CommOptions) {
  TS_FAIL("[comm nccl] cuda:", device,
          ": this binary was built without CUDA (--config=cpu or no toolkit); expected a "
          "build with the CUDA backend for NCCL");
}

}  // namespace tessera::parallel
