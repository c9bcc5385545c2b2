#include "core/tensor.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>

#include "core/cuda_runtime.h"
#include "core/grad_mode.h"

namespace tessera {
namespace {

// Resolves a single -1 in `shape` against `numel`.
Shape infer_shape(const Shape& shape, int64_t numel, const char* op, const Shape& from) {
  Shape out = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      TS_CHECK(infer < 0, "[", op, "] at most one dimension may be -1, found ", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      TS_CHECK(out[i] >= 0, "[", op, "] expected non-negative sizes, found ", shape_str(shape));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    TS_CHECK(known != 0 && numel % known == 0, "[", op, "] cannot infer -1 in ", shape_str(shape),
             " for ", numel, " elements of ", shape_str(from));
    out[infer] = numel / known;
  }
  TS_CHECK(numel_of(out) == numel, "[", op, "] shape ", shape_str(shape), " has ", numel_of(out),
           " elements, expected ", numel, " as in ", shape_str(from));
  return out;
}

// Strides that view (old shape, old strides) as `shape` without copying, if any exist.
std::optional<Strides> view_strides(const Shape& old_shape, const Strides& old_strides,
                                    const Shape& shape) {
  Strides strides(shape.size());
  if (old_shape.empty() || numel_of(old_shape) == 0) return contiguous_strides(shape);
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    // A chunk of old dims ends where the memory is no longer contiguous across dims.
    if (d == 0 ||
        (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}

}  // namespace

Tensor make_tensor(const Shape& shape, DType dtype, Device device) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage::allocate(static_cast<size_t>(numel_of(shape)) * itemsize(dtype), device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

const TensorImpl& Tensor::checked() const {
  TS_CHECK(impl_ != nullptr, "[tensor] expected a defined tensor, found an undefined one");
  return *impl_;
}

int64_t Tensor::size(int64_t d) const { return shape()[normalize_dim(d, dim(), "size")]; }

int64_t Tensor::stride(int64_t d) const { return strides()[normalize_dim(d, dim(), "stride")]; }

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape()) n *= d;
  return n;
}

bool Tensor::is_contiguous() const {
  const TensorImpl& t = checked();
  int64_t expected = 1;
  for (size_t i = t.shape.size(); i-- > 0;) {
    if (t.shape[i] == 1) continue;
    if (t.shape[i] == 0) return true;
    if (t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return str_cat("Tensor(", dtype_name(dtype()), ", ", device(), ", ", shape_str(shape()), ")");
}

void* Tensor::raw_data() const {
  const TensorImpl& t = checked();
  TS_CHECK(t.storage.nbytes() > 0 || numel() == 0, "[tensor] ", str(),
           " reads memory that has been released (a ZeRO-3 partitioned parameter used outside "
           "a ModuleCall of its module, see autograd/module.h)");
  return static_cast<char*>(t.storage.data()) + t.offset * static_cast<int64_t>(itemsize());
}

template <class T>
T Tensor::item() const {
  TS_CHECK(numel() == 1, "[item] expected a tensor with one element, found shape ",
           shape_str(shape()));
  return to_vector<T>()[0];
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = detach().to(Device::cpu()).to(dtype_of<T>()).contiguous();
  std::vector<T> out(static_cast<size_t>(host.numel()));
  if (!out.empty()) std::memcpy(out.data(), host.raw_data(), out.size() * sizeof(T));
  return out;
}

#define TS_INSTANTIATE_ACCESS(T)      \
  template T Tensor::item<T>() const; \
  template std::vector<T> Tensor::to_vector<T>() const;
TS_INSTANTIATE_ACCESS(float)
TS_INSTANTIATE_ACCESS(double)
TS_INSTANTIATE_ACCESS(Half)
TS_INSTANTIATE_ACCESS(BFloat16)
TS_INSTANTIATE_ACCESS(int32_t)
TS_INSTANTIATE_ACCESS(int64_t)
TS_INSTANTIATE_ACCESS(uint8_t)
#undef TS_INSTANTIATE_ACCESS

// Through the bool dtype first: non-zero is true (0.5 must not truncate to false via u8).
template <>
std::vector<bool> Tensor::to_vector<bool>() const {
  std::vector<uint8_t> bytes = to(DType::boolean).to_vector<uint8_t>();
  return std::vector<bool>(bytes.begin(), bytes.end());
}

template <>
bool Tensor::item<bool>() const {
  TS_CHECK(numel() == 1, "[item] expected a tensor with one element, found shape ",
           shape_str(shape()));
  return to_vector<bool>()[0];
}

void Tensor::check_raw_view(const char* op) const {
  TS_CHECK(!(requires_grad() && GradMode::is_enabled()), "[", op,
           "] raw view of a tensor that requires grad would drop its gradient: use tessera::", op,
           " from //autograd, or take the view under NoGradGuard or on detach()");
}

Tensor Tensor::make_view(const char* op, Shape shape, Strides strides, int64_t offset) const {
  check_raw_view(op);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = checked().storage;
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype();
  return Tensor(std::move(impl));
}

Tensor Tensor::view(const Shape& new_shape) const {
  Shape s = infer_shape(new_shape, numel(), "view", shape());
  std::optional<Strides> st = view_strides(shape(), strides(), s);
  TS_CHECK(st.has_value(), "[view] cannot view strides ", shape_str(strides()), " of shape ",
           shape_str(shape()), " as shape ", shape_str(s), " without a copy: use reshape");
  return make_view("view", std::move(s), std::move(*st), storage_offset());
}

Tensor Tensor::reshape(const Shape& new_shape) const {
  Shape s = infer_shape(new_shape, numel(), "reshape", shape());
  if (std::optional<Strides> st = view_strides(shape(), strides(), s)) {
    return make_view("reshape", std::move(s), std::move(*st), storage_offset());
  }
  check_raw_view("reshape");
  return contiguous().view(s);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  d0 = normalize_dim(d0, dim(), "transpose");
  d1 = normalize_dim(d1, dim(), "transpose");
  Shape s = shape();
  Strides st = strides();
  if (dim() > 0) {
    std::swap(s[d0], s[d1]);
    std::swap(st[d0], st[d1]);
  }
  return make_view("transpose", std::move(s), std::move(st), storage_offset());
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  TS_CHECK(static_cast<int64_t>(dims.size()) == dim(), "[permute] expected ", dim(),
           " dims for shape ", shape_str(shape()), ", found ", shape_str(dims));
  Shape s(dims.size());
  Strides st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = normalize_dim(dims[i], dim(), "permute");
    TS_CHECK(!seen[d], "[permute] expected a permutation of the dims, found ", shape_str(dims));
    seen[d] = true;
    s[i] = shape()[d];
    st[i] = strides()[d];
  }
  return make_view("permute", std::move(s), std::move(st), storage_offset());
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = normalize_dim(d, dim(), "narrow");
  TS_CHECK(dim() > 0, "[narrow] expected at least one dim, found a scalar");
  const int64_t n = shape()[d];
  TS_CHECK(start >= 0 && length >= 0 && start + length <= n, "[narrow] range [", start, ", ",
           start + length, ") out of bounds for dim ", d, " of size ", n, " in ",
           shape_str(shape()));
  Shape s = shape();
  s[d] = length;
  return make_view("narrow", std::move(s), strides(), storage_offset() + start * strides()[d]);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = normalize_dim(d, dim(), "slice");
  TS_CHECK(dim() > 0, "[slice] expected at least one dim, found a scalar");
  TS_CHECK(step > 0, "[slice] expected a positive step, found ", step);
  const int64_t n = shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape s = shape();
  Strides st = strides();
  s[d] = (end - start + step - 1) / step;
  const int64_t offset = storage_offset() + start * st[d];
  st[d] *= step;
  return make_view("slice", std::move(s), std::move(st), offset);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  TS_CHECK(dim() > 0, "[select] expected at least one dim, found a scalar");
  d = normalize_dim(d, dim(), "select");
  const int64_t n = shape()[d];
  TS_CHECK(index >= -n && index < n, "[select] index ", index, " out of range for dim ", d,
           " of size ", n);
  if (index < 0) index += n;
  Shape s = shape();
  Strides st = strides();
  const int64_t offset = storage_offset() + index * st[d];
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return make_view("select", std::move(s), std::move(st), offset);
}

Tensor Tensor::expand(const Shape& new_shape) const {
  TS_CHECK(new_shape.size() >= shape().size(), "[expand] cannot expand ", shape_str(shape()),
           " to fewer dims ", shape_str(new_shape));
  const size_t lead = new_shape.size() - shape().size();
  Shape s(new_shape.size());
  Strides st(new_shape.size());
  for (size_t i = 0; i < new_shape.size(); ++i) {
    if (i < lead) {
      TS_CHECK(new_shape[i] >= 0, "[expand] new leading dims must be sized, found ",
               shape_str(new_shape));
      s[i] = new_shape[i];
      st[i] = 0;
      continue;
    }
    const int64_t old = shape()[i - lead];
    const int64_t want = new_shape[i] == -1 ? old : new_shape[i];
    TS_CHECK(want >= 0, "[expand] expected sizes >= 0 or -1, found ", shape_str(new_shape));
    TS_CHECK(want == old || old == 1, "[expand] cannot expand ", shape_str(shape()), " to ",
             shape_str(new_shape), ": dim ", i, " is ", old, ", not 1");
    s[i] = want;
    st[i] = want == old ? strides()[i - lead] : 0;
  }
  return make_view("expand", std::move(s), std::move(st), storage_offset());
}

Tensor Tensor::squeeze() const {
  Shape s;
  Strides st;
  for (int64_t i = 0; i < dim(); ++i) {
    if (shape()[i] != 1) {
      s.push_back(shape()[i]);
      st.push_back(strides()[i]);
    }
  }
  return make_view("squeeze", std::move(s), std::move(st), storage_offset());
}

Tensor Tensor::squeeze(int64_t d) const {
  d = normalize_dim(d, dim(), "squeeze");
  if (dim() == 0 || shape()[d] != 1)
    return make_view("squeeze", shape(), strides(), storage_offset());
  Shape s = shape();
  Strides st = strides();
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return make_view("squeeze", std::move(s), std::move(st), storage_offset());
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = normalize_dim(d, dim() + 1, "unsqueeze");
  Shape s = shape();
  Strides st = strides();
  const int64_t stride = d < dim() ? st[d] * s[d] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, stride);
  return make_view("unsqueeze", std::move(s), std::move(st), storage_offset());
}

Tensor Tensor::flatten() const { return reshape({numel()}); }

Tensor Tensor::as_strided(const Shape& new_shape, const Strides& new_strides,
                          int64_t offset) const {
  TS_CHECK(new_shape.size() == new_strides.size(), "[as_strided] shape ", shape_str(new_shape),
           " and strides ", shape_str(new_strides), " differ in rank");
  int64_t last = offset;
  for (size_t i = 0; i < new_shape.size(); ++i) {
    TS_CHECK(new_strides[i] >= 0, "[as_strided] expected non-negative strides, found ",
             shape_str(new_strides));
    TS_CHECK(new_shape[i] >= 0, "[as_strided] expected non-negative sizes, found ",
             shape_str(new_shape));
    if (new_shape[i] == 0) last = offset - 1;
    if (last >= offset) last += (new_shape[i] - 1) * new_strides[i];
  }
  const int64_t capacity = static_cast<int64_t>(storage().nbytes() / itemsize());
  TS_CHECK(offset >= 0 && last < capacity, "[as_strided] view of shape ", shape_str(new_shape),
           " strides ", shape_str(new_strides), " offset ", offset, " exceeds the storage of ",
           capacity, " elements");
  return make_view("as_strided", new_shape, new_strides, offset);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  check_raw_view("contiguous");
  return clone();
}

Tensor Tensor::clone() const {
  Tensor out = make_tensor(shape(), dtype(), device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(Device target, bool non_blocking) const {
  if (device() == target) return *this;
  Tensor out = make_tensor(shape(), dtype(), target);
  if (non_blocking && target.is_cuda() && is_contiguous() && is_pinned() && numel() > 0) {
    cuda::memcpy_from_pinned_async(out.raw_data(), raw_data(), nbytes(), target.index);
    return out;
  }
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(DType target) const {
  if (dtype() == target) return *this;
  Tensor out = make_tensor(shape(), target, device());
  out.copy_(*this);
  return out;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>(checked());
  impl->autograd.reset();
  return Tensor(std::move(impl));
}

void Tensor::set_data(const Tensor& src) const {
  TS_CHECK(src.shape() == shape() && src.dtype() == dtype() && src.device() == device(),
           "[set_data] expected data of ", str(), ", found ", src.str());
  TensorImpl& impl = *impl_;
  const TensorImpl& from = src.checked();
  impl.storage = from.storage;
  impl.strides = from.strides;
  impl.offset = from.offset;
}

void Tensor::replace_data(const Tensor& src) const {
  TS_CHECK(src.shape() == shape(), "[replace_data] expected data of shape ", shape_str(shape()),
           ", found ", src.str());
  TensorImpl& impl = *impl_;
  const TensorImpl& from = src.checked();
  impl.storage = from.storage;
  impl.strides = from.strides;
  impl.offset = from.offset;
  impl.dtype = from.dtype;
  if (impl.autograd) impl.autograd->grad.reset();
}

bool Tensor::requires_grad() const {
  const AutogradMeta* m = checked().autograd.get();
  return m != nullptr && m->requires_grad;
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  TS_CHECK(is_leaf(),
           "[set_requires_grad] expected a leaf tensor; this one was produced by an op "
           "(use detach() to make a new leaf)");
  TS_CHECK(!requires_grad || is_floating(dtype()),
           "[set_requires_grad] only floating-point tensors can require grad, found dtype ",
           dtype_name(dtype()));
  ensure_autograd_meta().requires_grad = requires_grad;
  return *this;
}

Tensor Tensor::grad() const {
  const AutogradMeta* m = checked().autograd.get();
  return m != nullptr && m->grad ? *m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& grad) const {
  AutogradMeta& m = ensure_autograd_meta();
  if (!grad.defined()) {
    m.grad.reset();
    return;
  }
  TS_CHECK(grad.shape() == shape() && grad.dtype() == dtype() && grad.device() == device(),
           "[set_grad] gradient ", grad.str(), " does not match tensor ", str());
  m.grad = std::make_shared<Tensor>(grad);
}

bool Tensor::is_leaf() const {
  const AutogradMeta* m = checked().autograd.get();
  return m == nullptr || m->grad_fn == nullptr;
}

AutogradMeta& Tensor::ensure_autograd_meta() const {
  const TensorImpl& t = checked();
  if (!t.autograd) impl_->autograd = std::make_shared<AutogradMeta>();
  return *impl_->autograd;
}

}  // namespace tessera
