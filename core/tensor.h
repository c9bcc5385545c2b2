// Tensor: a cheap handle to a TensorImpl (storage, shape, strides, offset, dtype).
//
// Copying a Tensor copies the handle: both name the same data. Views (reshape,
// transpose, narrow, expand, ...) share storage and never copy; contiguous() copies only
// when the layout requires it. A default-constructed Tensor is undefined and says so.
//
// Note [Raw views and autograd]
// The view methods here are the raw, non-recording versions. Differentiable code uses the
// free functions of //autograd (tessera::transpose, tessera::reshape, ...), which record
// the view on the graph. To keep a gradient from being lost silently, a raw view of a
// tensor that requires grad throws while grad mode is on; call it under NoGradGuard, or
// on detach(), when a raw alias is what you want.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"
#include "core/storage.h"

namespace tessera {

class Node;  // an autograd graph node, defined in //autograd
class Tensor;

// Gradient state of a tensor; created when a tensor first takes part in autograd.
struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<Tensor> grad;          // accumulated gradient of a leaf (or retained)
  std::shared_ptr<Node> grad_fn;         // the node that produced this tensor; null for leaves
  uint32_t output_nr = 0;                // which output of grad_fn this tensor is
  std::weak_ptr<Node> grad_accumulator;  // a leaf's accumulation node, shared by all uses
  // Called with the leaf's accumulated gradient once per backward, after accumulation.
  std::vector<std::function<void(Tensor&)>> post_accumulate_hooks;
};

struct TensorImpl {
  Storage storage;
  Shape shape;
  Strides strides;
  int64_t offset = 0;  // in elements, from storage.data()
  DType dtype = DType::f32;
  std::shared_ptr<AutogradMeta> autograd;  // null until autograd needs it
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  // True when both handles name the same TensorImpl.
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  // True when this handle is the only one to its TensorImpl and its storage.
  bool is_unique() const { return impl_.use_count() == 1 && impl_->storage.use_count() == 1; }

  // ---- metadata -------------------------------------------------------------------------
  const Shape& shape() const { return checked().shape; }
  const Strides& strides() const { return checked().strides; }
  int64_t dim() const { return static_cast<int64_t>(checked().shape.size()); }
  int64_t size(int64_t dim) const;  // negative dims count from the end
  int64_t stride(int64_t dim) const;
  int64_t numel() const;
  int64_t storage_offset() const { return checked().offset; }
  DType dtype() const { return checked().dtype; }
  Device device() const { return checked().storage.device(); }
  size_t itemsize() const { return tessera::itemsize(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * itemsize(); }
  const Storage& storage() const { return checked().storage; }
  // Whether the elements have memory: false once the storage is released (a ZeRO-3
  // parameter between gathers, one built under DeferredInitGuard) until it is reallocated.
  bool materialized() const { return numel() == 0 || storage().nbytes() > 0; }
  bool is_contiguous() const;
  // "Tensor(f32, cpu, (2, 3))", or "Tensor(undefined)".
  std::string str() const;

  // ---- data access ----------------------------------------------------------------------
  // Pointer to element 0 of the view; T must match dtype().
  template <class T>
  T* data_ptr() const {
    TS_CHECK(dtype_of<T>() == dtype(), "[data_ptr] expected dtype ", dtype_name(dtype_of<T>()),
             ", found ", dtype_name(dtype()));
    return static_cast<T*>(raw_data());
  }
  void* raw_data() const;
  // The single element of a one-element tensor, converted to T (copies from the device).
  template <class T>
  T item() const;
  // All elements in row-major order, converted to T (copies from the device).
  template <class T>
  std::vector<T> to_vector() const;

  // ---- raw views (see Note [Raw views and autograd]) ---------------------------------------
  // Same data with a new shape; one dim may be -1. Throws when the strides do not allow it.
  Tensor view(const Shape& shape) const;
  // view() when possible, otherwise a contiguous copy.
  Tensor reshape(const Shape& shape) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  // Elements [start, start + length) of `dim`.
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  // Elements start, start + step, ... below `end` of `dim` (negative start/end count from
  // the end, as in Python slices; out-of-range bounds are clamped).
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  // Removes `dim` by taking element `index` of it.
  Tensor select(int64_t dim, int64_t index) const;
  // Broadcasts size-1 dims (and new leading dims) to `shape` with stride 0; -1 keeps a dim.
  Tensor expand(const Shape& shape) const;
  Tensor squeeze() const;  // all size-1 dims
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten() const;  // reshape({numel()})
  Tensor as_strided(const Shape& shape, const Strides& strides, int64_t offset) const;

  // ---- copies ------------------------------------------------------------------------------
  // This tensor when already contiguous, otherwise a contiguous copy.
  Tensor contiguous() const;
  // A contiguous copy with its own storage.
  Tensor clone() const;
  // Copy on `device` (this tensor when already there). With `non_blocking`, a contiguous
  // CPU tensor in pinned memory (pin_memory()) is copied to a CUDA device asynchronously:
  // the copy is queued on the device's compute stream, which runs it before any later
  // kernel, and the caller must not write the source until the device has done it (Note
  // [Pinned host memory] in core/cuda_runtime.h). Other copies ignore the flag.
  Tensor to(Device device, bool non_blocking = false) const;
  // A contiguous copy in page-locked host memory (this tensor when already pinned); throws
  // without a CUDA device.
  Tensor pin_memory() const;
  // True for a CPU tensor whose memory comes from pin_memory().
  bool is_pinned() const;
  // Copy converted to `dtype` (this tensor when already of that dtype).
  Tensor to(DType dtype) const;
  // Shares data and shape but carries no autograd state.
  Tensor detach() const;
  // Makes every handle of this tensor see `src`'s data from now on (PyTorch's
  // `param.data = src`): storage, strides and offset are taken from `src`, which must have
  // this shape, dtype and device; autograd state (requires_grad, grad, hooks) is kept.
  // ZeRO uses it to turn parameters into views of one flat buffer.
  void set_data(const Tensor& src) const;
  // As set_data, but `src` may have another dtype and device (Module::to); the tensor's
  // accumulated gradient, if any, is dropped as it no longer matches.
  void replace_data(const Tensor& src) const;
  // Copies `src` (broadcast to this shape, cast to this dtype, any device) into this view.
  const Tensor& copy_(const Tensor& src) const;
  // copy_ from a CPU tensor into this contiguous CUDA view without waiting: `src` is converted
  // into `staging` (pinned host memory of at least nbytes(), any dtype) and that copy queued on
  // the device's compute stream, which runs it before any later kernel. `src` may change at
  // once; `staging` must not be written until the device has read it (an Event recorded
  // after this call and waited for, or a later synchronous copy to the host).
  const Tensor& copy_queued_(const Tensor& src, const Tensor& staging) const;
  // Sets every element of this view to `value`.
  const Tensor& fill_(double value) const;

  // ---- autograd state (the graph itself lives in //autograd) --------------------------------
  bool requires_grad() const;
  // Marks a leaf as requiring a gradient; throws on non-leaves and non-floating dtypes.
  Tensor& set_requires_grad(bool requires_grad);
  // The accumulated gradient; undefined until a backward reaches this tensor.
  Tensor grad() const;
  void set_grad(const Tensor& grad) const;
  // True for tensors not produced by a recorded op.
  bool is_leaf() const;
  AutogradMeta* autograd_meta() const { return checked().autograd.get(); }
  AutogradMeta& ensure_autograd_meta() const;

 private:
  const TensorImpl& checked() const;
  // Throws when a raw view would drop a gradient (Note [Raw views and autograd]).
  void check_raw_view(const char* op) const;
  Tensor make_view(const char* op, Shape shape, Strides strides, int64_t offset) const;

  std::shared_ptr<TensorImpl> impl_;
};

// Allocates an uninitialized tensor in a new storage (used by factories and kernels).
Tensor make_tensor(const Shape& shape, DType dtype, Device device);

}  // namespace tessera
