// The descriptor owner and graph builder of kernels/cuda/cudnn_graph.h.
#include <utility>

#include "core/error.h"
#include "kernels/cuda/cudnn_graph.h"

namespace tessera::kernels::cuda::cudnn {
namespace {

constexpr int64_t kAlignmentBytes = 16;  // every operand's (kernels/fused_attention.h)

std::string last_error() {
  char message[1024] = {};
  cudnnGetLastErrorString(message, sizeof(message));
  return message;
}

std::string status_text(cudnnStatus_t status) {
  const std::string detail = last_error();
  return std::string(cudnnGetErrorString(status)) + (detail.empty() ? "" : " (" + detail + ")");
}

}  // namespace

void check(cudnnStatus_t status, const char* op, const char* call) {
  TS_CHECK(status == CUDNN_STATUS_SUCCESS, "[", op, "] ", call, " failed: ", status_text(status));
}

Descriptor::Descriptor(cudnnBackendDescriptorType_t type, const char* op) : op_(op) {
  check(cudnnBackendCreateDescriptor(type, &desc_), op, "cudnnBackendCreateDescriptor");
}

Descriptor::~Descriptor() {
  if (desc_ != nullptr) cudnnBackendDestroyDescriptor(desc_);
}

Descriptor& Descriptor::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                            int64_t count, const void* values) {
  const cudnnStatus_t status = cudnnBackendSetAttribute(desc_, name, type, count, values);
  TS_CHECK(status == CUDNN_STATUS_SUCCESS, "[", op_, "] cudnnBackendSetAttribute(",
           static_cast<int>(name), ") failed: ", status_text(status));
  return *this;
}

Descriptor& Descriptor::set_desc(cudnnBackendAttributeName_t name, const Descriptor& value) {
  const cudnnBackendDescriptor_t d = value.get();
  return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
}

Descriptor& Descriptor::finalize() {
  check(cudnnBackendFinalize(desc_), op_, "cudnnBackendFinalize");
  return *this;
}

cudnnStatus_t Descriptor::try_finalize() { return cudnnBackendFinalize(desc_); }

Plan::Plan(std::vector<std::unique_ptr<Descriptor>> keep, std::unique_ptr<Descriptor> plan,
           int64_t workspace_bytes)
    : keep_(std::move(keep)), plan_(std::move(plan)), workspace_bytes_(workspace_bytes) {}

void Plan::execute(cudnnHandle_t handle, const std::vector<int64_t>& uids,
                   const std::vector<void*>& pointers, void* workspace, const char* op) const {
  TS_CHECK(uids.size() == pointers.size(), "[", op, "] expected one pointer per uid, found ",
           pointers.size(), " for ", uids.size());
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, op);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()),
           uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
           static_cast<int64_t>(pointers.size()), pointers.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace)
      .finalize();
  check(cudnnBackendExecute(handle, plan_->get(), pack.get()), op, "cudnnBackendExecute");
}

const Descriptor* GraphBuilder::keep(std::unique_ptr<Descriptor> d) {
  descriptors_.push_back(std::move(d));
  return descriptors_.back().get();
}

const Descriptor* GraphBuilder::tensor(const TensorSpec& spec) {
  TS_CHECK(spec.dims.size() == spec.strides.size(), "[", op_, "] tensor ", spec.uid, " has ",
           spec.dims.size(), " dims and ", spec.strides.size(), " strides");
  auto d = std::make_unique<Descriptor>(CUDNN_BACKEND_TENSOR_DESCRIPTOR, op_);
  const int64_t rank = static_cast<int64_t>(spec.dims.size());
  d->set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &spec.dtype)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, rank, spec.dims.data())
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, rank, spec.strides.data())
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &spec.uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &kAlignmentBytes);
  const bool yes = true;
  if (spec.is_virtual) d->set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
  if (spec.by_value) d->set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
  d->finalize();
  return keep(std::move(d));
}

const Descriptor* GraphBuilder::virtual_tensor(const std::vector<int64_t>& dims,
                                               const std::vector<int64_t>& strides,
                                               cudnnDataType_t dtype) {
  return tensor({next_virtual_uid_++, dtype, dims, strides, /*is_virtual=*/true});
}

void GraphBuilder::matmul(const Descriptor* a, const Descriptor* b, const Descriptor* c) {
  auto desc = std::make_unique<Descriptor>(CUDNN_BACKEND_MATMUL_DESCRIPTOR, op_);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  desc->set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute).finalize();
  auto op = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, op_);
  op->set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, *a)
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, *b)
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, *c)
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, *desc)
      .finalize();
  keep(std::move(desc));
  ops_.push_back(keep(std::move(op)));
}

void GraphBuilder::pointwise(cudnnPointwiseMode_t mode, const Descriptor* x, const Descriptor* b,
                             const Descriptor* y, cudnnDataType_t precision, const Descriptor* t,
                             int64_t axis) {
  auto desc = std::make_unique<Descriptor>(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, op_);
  desc->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
      .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision);
  if (mode == CUDNN_POINTWISE_GEN_INDEX) {
    desc->set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
  }
  desc->finalize();
  auto op = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, op_);
  op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, *desc)
      .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, *x);
  if (b != nullptr) op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
  if (t != nullptr) op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
  const float one = 1.0f;
  op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, *y)
      .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one)
      .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one)
      .finalize();
  keep(std::move(desc));
  ops_.push_back(keep(std::move(op)));
}

void GraphBuilder::reduction(cudnnReduceTensorOp_t mode, const Descriptor* x, const Descriptor* y,
                             int64_t cudnn_version) {
  auto desc = std::make_unique<Descriptor>(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, op_);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  desc->set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode)
      .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
#if CUDNN_VERSION >= 91100  // the attribute is new in 9.11; false is what fuses
  if (cudnn_version >= 91100) {
    const bool deterministic = false;
    desc->set(CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &deterministic);
  }
#endif
  desc->finalize();
  auto op = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, op_);
  op->set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, *desc)
      .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, *x)
      .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, *y)
      .finalize();
  keep(std::move(desc));
  ops_.push_back(keep(std::move(op)));
}

void GraphBuilder::reshape(const Descriptor* x, const Descriptor* y) {
  auto op = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, op_);
  op->set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, *x)
      .set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, *y)
      .finalize();
  ops_.push_back(keep(std::move(op)));
}

std::unique_ptr<Plan> GraphBuilder::build(cudnnHandle_t handle, std::string& why_not) {
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const Descriptor* op : ops_) ops.push_back(op->get());
  auto graph = std::make_unique<Descriptor>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, op_);
  graph
      ->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
            static_cast<int64_t>(ops.size()), ops.data())
      .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  if (const cudnnStatus_t s = graph->try_finalize(); s != CUDNN_STATUS_SUCCESS) {
    why_not = "cuDNN refused the operation graph: " + status_text(s);
    return nullptr;
  }
  Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, op_);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  heuristics.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, *graph)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (const cudnnStatus_t s = heuristics.try_finalize(); s != CUDNN_STATUS_SUCCESS) {
    why_not = "cuDNN's heuristics refused the operation graph: " + status_text(s);
    return nullptr;
  }
  int64_t count = 0;
  check(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
        op_, "cudnnBackendGetAttribute(ENGINEHEUR_RESULTS)");
  std::vector<std::unique_ptr<Descriptor>> configs;
  std::vector<cudnnBackendDescriptor_t> config_handles;
  for (int64_t i = 0; i < count; ++i) {
    configs.push_back(std::make_unique<Descriptor>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, op_));
    config_handles.push_back(configs.back()->get());
  }
  int64_t returned = 0;
  if (count > 0) {
    check(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned,
                                   config_handles.data()),
          op_, "cudnnBackendGetAttribute(ENGINEHEUR_RESULTS)");
  }
  std::string last = "no engine configuration";
  for (int64_t i = 0; i < returned; ++i) {
    auto plan = std::make_unique<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, op_);
    plan->set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *configs[i])
        .set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    if (const cudnnStatus_t s = plan->try_finalize(); s != CUDNN_STATUS_SUCCESS) {
      last = status_text(s);
      continue;
    }
    int64_t workspace = 0;
    check(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                   CUDNN_TYPE_INT64, 1, nullptr, &workspace),
          op_, "cudnnBackendGetAttribute(EXECUTION_PLAN_WORKSPACE_SIZE)");
    descriptors_.push_back(std::move(graph));
    descriptors_.push_back(std::move(configs[i]));
    return std::make_unique<Plan>(std::move(descriptors_), std::move(plan), workspace);
  }
  why_not = "no engine of cuDNN " + std::to_string(cudnnGetVersion()) + " runs the graph (" +
            std::to_string(returned) + " configurations tried; last: " + last + ")";
  return nullptr;
}

}  // namespace tessera::kernels::cuda::cudnn
