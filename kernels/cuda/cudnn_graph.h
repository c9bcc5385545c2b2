// A thin owner of cuDNN 9 backend descriptors and the operation graphs built from them:
// tensors, matmul, pointwise, reduction and reshape operations, the graph's execution plan
// (heuristics mode A, the first engine configuration that finalizes, as cudnn-frontend
// does: include/cudnn_frontend/plans.h in NVIDIA/cudnn-frontend) and its execution with a
// variant pack. Host code; included by kernels/cuda/*.cu only.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera::kernels::cuda::cudnn {

// Throws "[op] <call> failed: <status> (<cuDNN's last error message>)" unless success.
void check(cudnnStatus_t status, const char* op, const char* call);

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  Descriptor(cudnnBackendDescriptorType_t type, const char* op);
  ~Descriptor();
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return desc_; }

  // Sets attribute `name` to `count` values of `type` at `values`.
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                  const void* values);
  Descriptor& set_desc(cudnnBackendAttributeName_t name, const Descriptor& value);
  // Throws on failure; try_finalize reports it instead.
  Descriptor& finalize();
  cudnnStatus_t try_finalize();

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
  const char* op_;
};

// A tensor of the graph: `uid` names it in the variant pack (virtual ones never appear
// there); by-value tensors are (1, 1, 1, 1) scalars passed as host pointers.
struct TensorSpec {
  int64_t uid = 0;
  cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
  std::vector<int64_t> dims, strides;  // elements
  bool is_virtual = false;
  bool by_value = false;
};

// A finalized plan with the workspace it needs.
class Plan {
 public:
  Plan(std::vector<std::unique_ptr<Descriptor>> keep, std::unique_ptr<Descriptor> plan,
       int64_t workspace_bytes);

  int64_t workspace_bytes() const { return workspace_bytes_; }

  // Runs the plan: uids[i] is at pointers[i] (device memory, or a host scalar for a
  // by-value tensor); `workspace` holds workspace_bytes().
  void execute(cudnnHandle_t handle, const std::vector<int64_t>& uids,
               const std::vector<void*>& pointers, void* workspace, const char* op) const;

 private:
  std::vector<std::unique_ptr<Descriptor>> keep_;  // the graph the plan was built from
  std::unique_ptr<Descriptor> plan_;
  int64_t workspace_bytes_;
};

// Builds one operation graph. Tensors are finalized when added and referred to by the
// pointer returned; operations take effect in the order added.
class GraphBuilder {
 public:
  explicit GraphBuilder(const char* op) : op_(op) {}

  const Descriptor* tensor(const TensorSpec& spec);
  // A virtual FLOAT tensor (or `dtype`) with the next free uid from kFirstVirtualUid.
  const Descriptor* virtual_tensor(const std::vector<int64_t>& dims,
                                   const std::vector<int64_t>& strides,
                                   cudnnDataType_t dtype = CUDNN_DATA_FLOAT);

  // c = a b over the last two dims (f32 accumulation).
  void matmul(const Descriptor* a, const Descriptor* b, const Descriptor* c);
  // y = mode(x[, b[, t]]) in `precision`; GEN_INDEX takes `axis`.
  void pointwise(cudnnPointwiseMode_t mode, const Descriptor* x, const Descriptor* b,
                 const Descriptor* y, cudnnDataType_t precision = CUDNN_DATA_FLOAT,
                 const Descriptor* t = nullptr, int64_t axis = -1);
  // y = x reduced (ADD or MAX) over the dims where y has size 1.
  void reduction(cudnnReduceTensorOp_t mode, const Descriptor* x, const Descriptor* y,
                 int64_t cudnn_version);
  // y = x with y's dims and strides (the same bytes seen another way).
  void reshape(const Descriptor* x, const Descriptor* y);

  // The first configuration of heuristics mode A that finalizes; the reason when none
  // does (the caller falls back to other kernels).
  std::unique_ptr<Plan> build(cudnnHandle_t handle, std::string& why_not);

  static constexpr int64_t kFirstVirtualUid = 1000;

 private:
  const Descriptor* keep(std::unique_ptr<Descriptor> d);

  const char* op_;
  std::vector<std::unique_ptr<Descriptor>> descriptors_;  // everything the ops point to
  std::vector<const Descriptor*> ops_;
  int64_t next_virtual_uid_ = kFirstVirtualUid;
};

}  // namespace tessera::kernels::cuda::cudnn
