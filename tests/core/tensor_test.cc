#include "core/tensor.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/factories.h"
#include "core/grad_mode.h"
#include "tests/testing.h"

using Catch::Matchers::Contains;
using tessera::DType;
using tessera::Shape;
using tessera::Strides;
using tessera::Tensor;

namespace {

using tessera::testing::error_of;

const DType kAllDTypes[] = {DType::f32, DType::f16, DType::bf16, DType::f64,
                            DType::i32, DType::i64, DType::u8,   DType::boolean};

// 0, 1, ..., n-1 as f32 with `shape`.
Tensor iota(const Shape& shape) { return tessera::arange(tessera::numel_of(shape)).view(shape); }

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

bool same_storage(const Tensor& a, const Tensor& b) {
  return a.storage().data() == b.storage().data();
}

}  // namespace

TEST_CASE("a default tensor is undefined and says so", "[tensor]") {
  Tensor t;
  CHECK_FALSE(t.defined());
  CHECK(t.str() == "Tensor(undefined)");
  CHECK_THAT(error_of([&] { t.shape(); }), Contains("undefined"));
  CHECK_THAT(error_of([&] { t.numel(); }), Contains("undefined"));
  CHECK_THAT(error_of([&] { t.transpose(0, 1); }), Contains("undefined"));
  CHECK_THAT(error_of([&] { t.to_vector<float>(); }), Contains("undefined"));
  Tensor dst = tessera::zeros({2});
  CHECK_THAT(error_of([&] { dst.copy_(t); }), Contains("[copy_] expected a defined source tensor"));
}

TEST_CASE("metadata of a new tensor", "[tensor]") {
  Tensor t = tessera::empty({2, 3, 4}, {DType::bf16});
  CHECK(t.shape() == Shape{2, 3, 4});
  CHECK(t.strides() == Strides{12, 4, 1});
  CHECK(t.dim() == 3);
  CHECK(t.numel() == 24);
  CHECK(t.size(-1) == 4);
  CHECK(t.stride(0) == 12);
  CHECK(t.itemsize() == 2);
  CHECK(t.nbytes() == 48);
  CHECK(t.is_contiguous());
  CHECK(t.str() == "Tensor(bf16, cpu, (2, 3, 4))");
  CHECK_THAT(error_of([&] { t.size(3); }), Contains("[size] dim 3 out of range"));
  CHECK_THAT(error_of([&] { t.data_ptr<float>(); }),
             Contains("[data_ptr] expected dtype f32, found bf16"));
  Tensor s = tessera::scalar_tensor(2.5);
  CHECK(s.dim() == 0);
  CHECK(s.numel() == 1);
  CHECK(s.item<float>() == 2.5f);
}

TEST_CASE("transpose and permute are views that alias writes", "[tensor]") {
  Tensor t = iota({2, 3});
  Tensor tt = t.transpose(0, 1);
  CHECK(tt.shape() == Shape{3, 2});
  CHECK(tt.strides() == Strides{1, 3});
  CHECK(same_storage(t, tt));
  CHECK_FALSE(tt.is_contiguous());
  CHECK(values(tt) == std::vector<float>{0, 3, 1, 4, 2, 5});
  tt.select(0, 2).select(0, 0).fill_(42);  // tt[2][0] is t[0][2]
  CHECK(values(t) == std::vector<float>{0, 1, 42, 3, 4, 5});
  CHECK(t.transpose(-1, -2).shape() == Shape{3, 2});

  Tensor u = iota({2, 3, 4});
  Tensor p = u.permute({2, 0, 1});
  CHECK(p.shape() == Shape{4, 2, 3});
  CHECK(p.strides() == Strides{1, 12, 4});
  const std::vector<float> pv = values(p);
  for (int64_t k = 0; k < 4; ++k) {
    for (int64_t i = 0; i < 2; ++i) {
      for (int64_t j = 0; j < 3; ++j) CHECK(pv[k * 6 + i * 3 + j] == i * 12 + j * 4 + k);
    }
  }
  p.select(0, 3).fill_(-1);  // u[:, :, 3]
  CHECK(u.select(2, 3).to_vector<float>() == std::vector<float>(6, -1));
  CHECK(u.select(2, 2).to_vector<float>() == std::vector<float>{2, 6, 10, 14, 18, 22});

  CHECK_THAT(error_of([&] { t.transpose(0, 2); }), Contains("[transpose] dim 2 out of range"));
  CHECK_THAT(error_of([&] { u.permute({0, 1}); }), Contains("[permute] expected 3 dims"));
  CHECK_THAT(error_of([&] { u.permute({0, 1, 1}); }), Contains("[permute] expected a permutation"));
}

TEST_CASE("narrow, slice and select are views that alias writes", "[tensor]") {
  Tensor t = iota({4, 5});
  Tensor n = t.narrow(1, 1, 3);
  CHECK(n.shape() == Shape{4, 3});
  CHECK(n.storage_offset() == 1);
  CHECK(same_storage(t, n));
  CHECK(values(n.select(0, 1)) == std::vector<float>{6, 7, 8});
  n.narrow(0, 2, 1).fill_(0);  // t[2, 1:4]
  CHECK(values(t.select(0, 2)) == std::vector<float>{10, 0, 0, 0, 14});
  CHECK_THAT(error_of([&] { t.narrow(1, 3, 3); }),
             Contains("[narrow] range [3, 6) out of bounds for dim 1 of size 5"));
  CHECK_THAT(error_of([&] { t.narrow(1, -1, 1); }), Contains("[narrow]"));

  Tensor r = iota({10});
  Tensor s = r.slice(0, 1, 8, 3);
  CHECK(s.shape() == Shape{3});
  CHECK(s.strides() == Strides{3});
  CHECK(values(s) == std::vector<float>{1, 4, 7});
  s.fill_(-5);
  CHECK(values(r) == std::vector<float>{0, -5, 2, 3, -5, 5, 6, -5, 8, 9});
  CHECK(values(r.slice(0, -3, 10)) == std::vector<float>{-5, 8, 9});
  CHECK(values(r.slice(0, 7, 100, 2)) == std::vector<float>{-5, 9});
  CHECK(r.slice(0, 8, 3).numel() == 0);
  CHECK(values(r.slice(0, 0, -7, 2)) == std::vector<float>{0, 2});
  CHECK_THAT(error_of([&] { r.slice(0, 0, 5, 0); }),
             Contains("[slice] expected a positive step, found 0"));
  Tensor t2 = iota({3, 4});
  CHECK(values(t2.slice(1, 0, 4, 2)) == std::vector<float>{0, 2, 4, 6, 8, 10});

  Tensor sel = t2.select(1, -1);
  CHECK(sel.shape() == Shape{3});
  CHECK(values(sel) == std::vector<float>{3, 7, 11});
  sel.fill_(100);
  CHECK(values(t2.select(0, 0)) == std::vector<float>{0, 1, 2, 100});
  CHECK_THAT(error_of([&] { t2.select(0, 3); }),
             Contains("[select] index 3 out of range for dim 0 of size 3"));
  CHECK_THAT(error_of([&] { t2.select(2, 0); }), Contains("[select] dim 2 out of range"));
  CHECK_THAT(error_of([&] { tessera::scalar_tensor(1).select(0, 0); }),
             Contains("[select] expected at least one dim"));
}

TEST_CASE("expand broadcasts with stride 0 and shares storage", "[tensor]") {
  Tensor col = iota({3, 1});
  Tensor e = col.expand({2, 3, 4});
  CHECK(e.shape() == Shape{2, 3, 4});
  CHECK(e.strides() == Strides{0, 1, 0});
  CHECK(same_storage(col, e));
  const std::vector<float> ev = values(e);
  for (int64_t i = 0; i < 24; ++i) CHECK(ev[i] == (i / 4) % 3);
  CHECK(col.expand({-1, 5}).shape() == Shape{3, 5});
  col.fill_(7);
  CHECK(values(e) == std::vector<float>(24, 7));
  CHECK_THAT(error_of([&] {
               col.expand({3, 4, 2});
             }),
             Contains("[expand] cannot expand (3, 1) to (3, 4, 2)"));
  CHECK_THAT(error_of([&] { col.expand({4}); }), Contains("[expand] cannot expand (3, 1)"));
  CHECK_THAT(error_of([&] { col.expand({-1, 3}).expand({3, -2}); }), Contains("[expand]"));
  CHECK_THAT(error_of([&] { col.expand({3, -2}); }), Contains("[expand]"));
}

TEST_CASE("squeeze and unsqueeze", "[tensor]") {
  Tensor t = iota({1, 3, 1, 2});
  CHECK(t.squeeze().shape() == Shape{3, 2});
  CHECK(t.squeeze(0).shape() == Shape{3, 1, 2});
  CHECK(t.squeeze(1).shape() == Shape{1, 3, 1, 2});  // not size 1: unchanged
  CHECK(t.squeeze(-2).shape() == Shape{1, 3, 2});
  CHECK(same_storage(t, t.squeeze()));
  Tensor u = iota({3, 2}).unsqueeze(1);
  CHECK(u.shape() == Shape{3, 1, 2});
  CHECK(u.is_contiguous());
  CHECK(iota({3, 2}).unsqueeze(-1).shape() == Shape{3, 2, 1});
  CHECK(iota({3, 2}).unsqueeze(0).shape() == Shape{1, 3, 2});
  CHECK(tessera::scalar_tensor(1).unsqueeze(0).shape() == Shape{1});
  CHECK(iota({3, 2}).transpose(0, 1).unsqueeze(1).view({2, 3}).shape() == Shape{2, 3});
  CHECK_THAT(error_of([&] { iota({3, 2}).unsqueeze(3); }), Contains("[unsqueeze] dim 3"));
  CHECK_THAT(error_of([&] { t.squeeze(4); }), Contains("[squeeze] dim 4"));
  Tensor unsq = iota({2, 3}).unsqueeze(1);
  unsq.select(2, 1).fill_(9);
  CHECK(values(unsq) == std::vector<float>{0, 9, 2, 3, 9, 5});
}

TEST_CASE("view never copies; reshape copies only when it must", "[tensor]") {
  Tensor t = iota({2, 3, 4});
  Tensor v = t.view({6, 4});
  CHECK(same_storage(t, v));
  CHECK(v.strides() == Strides{4, 1});
  CHECK(t.view({-1}).shape() == Shape{24});
  CHECK(t.view({4, -1, 2}).shape() == Shape{4, 3, 2});
  CHECK(t.view({1, 24, 1}).shape() == Shape{1, 24, 1});
  CHECK_THAT(error_of([&] {
               t.view({5, 5});
             }),
             Contains("[view] shape (5, 5) has 25 elements, expected 24"));
  CHECK_THAT(error_of([&] {
               t.view({-1, -1});
             }),
             Contains("[view] at most one dimension may be -1"));
  CHECK_THAT(error_of([&] { t.view({5, -1}); }), Contains("[view] cannot infer -1"));

  // A transposed tensor can split a dim into pieces but not merge across the transpose.
  Tensor tr = t.transpose(0, 1);  // (3, 2, 4) strides (4, 12, 1)
  Tensor split = tr.view({3, 2, 2, 2});
  CHECK(same_storage(t, split));
  CHECK(split.strides() == Strides{4, 12, 2, 1});
  CHECK(values(split) == values(tr));
  CHECK_THAT(error_of([&] {
               tr.view({6, 4});
             }),
             Contains("[view] cannot view") && Contains("without a copy: use reshape"));
  Tensor rs = tr.reshape({6, 4});
  CHECK_FALSE(same_storage(t, rs));
  CHECK(rs.is_contiguous());
  CHECK(values(rs) == values(tr));
  rs.fill_(-1);  // a copy: the source is untouched
  CHECK(values(t) == values(iota({2, 3, 4})));

  // reshape is a view whenever view works, including non-contiguous inputs.
  Tensor rv = t.reshape({4, 6});
  CHECK(same_storage(t, rv));
  Tensor nar = iota({4, 6}).narrow(1, 0, 3);  // (4, 3) strides (6, 1)
  CHECK(same_storage(nar, nar.reshape({4, 3, 1})));
  CHECK(same_storage(nar, nar.reshape({2, 2, 3})));
  CHECK_FALSE(same_storage(nar, nar.reshape({12})));
  CHECK(values(nar.reshape({12})) == std::vector<float>{0, 1, 2, 6, 7, 8, 12, 13, 14, 18, 19, 20});
  CHECK_THAT(error_of([&] { nar.view({12}); }), Contains("[view]"));
  CHECK(nar.flatten().shape() == Shape{12});

  // Expanded tensors: viewing the broadcast dim apart works, merging it does not.
  Tensor ex = iota({3}).expand({2, 3});
  CHECK(ex.view({2, 3, 1}).strides()[0] == 0);
  CHECK_THAT(error_of([&] { ex.view({6}); }), Contains("[view]"));
  CHECK(values(ex.reshape({6})) == std::vector<float>{0, 1, 2, 0, 1, 2});

  // Empty and scalar tensors.
  CHECK(tessera::zeros({0, 3}).view({3, 0}).shape() == Shape{3, 0});
  CHECK(tessera::scalar_tensor(3).view({1, 1}).item<float>() == 3);
  CHECK(tessera::zeros({1}).view({}).dim() == 0);
}

TEST_CASE("contiguous copies only when needed; clone always copies", "[tensor]") {
  Tensor t = iota({3, 4});
  CHECK(t.contiguous().is_same(t));
  Tensor n = t.narrow(0, 1, 2);  // rows are still contiguous
  CHECK(n.is_contiguous());
  CHECK(n.contiguous().is_same(n));
  Tensor tr = t.transpose(0, 1);
  Tensor c = tr.contiguous();
  CHECK_FALSE(c.is_same(tr));
  CHECK_FALSE(same_storage(c, t));
  CHECK(c.is_contiguous());
  CHECK(c.storage_offset() == 0);
  CHECK(values(c) == values(tr));
  CHECK(iota({3, 1}).transpose(0, 1).is_contiguous());  // size-1 dims do not matter

  Tensor k = t.clone();
  CHECK_FALSE(same_storage(k, t));
  CHECK(values(k) == values(t));
  k.fill_(0);
  CHECK(values(t) == values(iota({3, 4})));
  Tensor kt = tr.clone();
  CHECK(kt.is_contiguous());
  CHECK(values(kt) == values(tr));
  CHECK(tessera::zeros({2}, {DType::i64}).clone().dtype() == DType::i64);
}

TEST_CASE("to(dtype) round trips every dtype pair", "[tensor]") {
  // Values exactly representable in every dtype but bool, and 0/1 for bool.
  const std::vector<double> small = {0, 1, 2, 3, 64, 127, 255};
  for (DType from : kAllDTypes) {
    const std::vector<double>& vals =
        from == DType::boolean ? std::vector<double>{0, 1, 1, 0} : small;
    Tensor src = tessera::from_vector(vals).to(from);
    CHECK(src.dtype() == from);
    CHECK(src.to(from).is_same(src));
    CHECK(src.to_vector<double>() == vals);
    for (DType to : kAllDTypes) {
      INFO(tessera::dtype_name(from) << " -> " << tessera::dtype_name(to));
      Tensor mid = src.to(to);
      CHECK(mid.dtype() == to);
      if (to == DType::boolean) {
        std::vector<double> expected;
        for (double v : vals) expected.push_back(v != 0 ? 1 : 0);
        CHECK(mid.to_vector<double>() == expected);
      } else {
        CHECK(mid.to(from).to_vector<double>() == vals);
      }
    }
  }
}

TEST_CASE("conversions round floats to nearest even and truncate to integers", "[tensor]") {
  Tensor f = tessera::from_vector<double>({2.7, -2.7, 0.1, 65520.0, 1e30, 0.5, -0.0});
  CHECK(f.narrow(0, 0, 4).to(DType::i32).to_vector<int32_t>() ==
        std::vector<int32_t>{2, -2, 0, 65520});
  const std::vector<float> h = f.to(DType::f16).to_vector<float>();
  CHECK(h[2] == 0.0999755859375f);  // nearest f16 to 0.1
  CHECK(std::isinf(h[3]));          // 65520 rounds up to inf in f16
  CHECK(h[5] == 0.5f);
  const std::vector<float> b = f.to(DType::bf16).to_vector<float>();
  CHECK(b[2] == 0.10009765625f);  // nearest bf16 to 0.1
  CHECK(b[4] == 1.0002555517425873e30f);
  CHECK(f.to(DType::boolean).to_vector<bool>() ==
        std::vector<bool>{true, true, true, true, true, true, false});
}

TEST_CASE("copy_ broadcasts and casts into any view", "[tensor]") {
  Tensor dst = tessera::zeros({2, 3}, {DType::f64});
  dst.copy_(tessera::from_vector<int32_t>({1, 2, 3}));
  CHECK(dst.to_vector<double>() == std::vector<double>{1, 2, 3, 1, 2, 3});
  dst.copy_(tessera::from_vector<float>({10, 20}, {2, 1}));
  CHECK(dst.to_vector<double>() == std::vector<double>{10, 10, 10, 20, 20, 20});
  dst.copy_(tessera::scalar_tensor(5, {DType::bf16}));
  CHECK(dst.to_vector<double>() == std::vector<double>(6, 5));
  // Into a transposed (non-contiguous) destination.
  Tensor base = tessera::zeros({3, 2}, {DType::i64});
  base.transpose(0, 1).copy_(iota({2, 3}));
  CHECK(base.to_vector<int64_t>() == std::vector<int64_t>{0, 3, 1, 4, 2, 5});
  // From a non-contiguous source of another dtype.
  Tensor out = tessera::empty({3, 2}, {DType::f16});
  out.copy_(iota({2, 3}).transpose(0, 1));
  CHECK(values(out) == std::vector<float>{0, 3, 1, 4, 2, 5});
  // Into a strided slice only.
  Tensor r = tessera::zeros({6}, {DType::u8});
  r.slice(0, 0, 6, 2).copy_(tessera::from_vector<uint8_t>({7, 8, 9}));
  CHECK(r.to_vector<uint8_t>() == std::vector<uint8_t>{7, 0, 8, 0, 9, 0});
  // Casting to bool keeps non-zero as true.
  Tensor bools = tessera::empty({3}, {DType::boolean});
  bools.copy_(tessera::from_vector<float>({0.0f, 0.25f, -3.0f}));
  CHECK(bools.to_vector<bool>() == std::vector<bool>{false, true, true});
  CHECK_THAT(error_of([&] { dst.copy_(tessera::zeros({4})); }),
             Contains("[copy_] shapes do not broadcast: (2, 3) vs (4)"));
  CHECK_THAT(error_of([&] {
               dst.copy_(tessera::zeros({2, 2, 3}));
             }),
             Contains("[copy_] source shape (2, 2, 3) does not broadcast to destination shape "
                      "(2, 3)"));
  // Empty tensors copy nothing.
  CHECK_NOTHROW(tessera::zeros({0, 3}).copy_(tessera::zeros({3})));
}

TEST_CASE("fill_ sets every element of a view", "[tensor]") {
  for (DType d : kAllDTypes) {
    INFO(tessera::dtype_name(d));
    Tensor t = tessera::zeros({3, 4}, {d});
    t.narrow(1, 1, 2).fill_(1);
    CHECK(t.to_vector<double>() == std::vector<double>{0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0});
  }
  Tensor b = tessera::zeros({2}, {DType::boolean});
  b.fill_(0.5);
  CHECK(b.to_vector<bool>() == std::vector<bool>{true, true});
  Tensor e = tessera::zeros({0});
  CHECK_NOTHROW(e.fill_(3));
}

TEST_CASE("item and to_vector convert to the requested type", "[tensor]") {
  Tensor t = tessera::from_vector<float>({0.5f, 0.0f, -2.0f, 3.0f}, {2, 2});
  CHECK(t.to_vector<double>() == std::vector<double>{0.5, 0, -2, 3});
  CHECK(t.to_vector<int64_t>() == std::vector<int64_t>{0, 0, -2, 3});
  // Non-zero is true, also for values that truncate to integer zero.
  CHECK(t.to_vector<bool>() == std::vector<bool>{true, false, true, true});
  CHECK(t.select(0, 0).select(0, 0).item<bool>());
  CHECK_FALSE(t.select(0, 1).select(0, 0).item<double>() == 0.0);
  CHECK(t.transpose(0, 1).to_vector<float>() == std::vector<float>{0.5f, -2, 0, 3});
  CHECK(t.narrow(0, 1, 1).narrow(1, 1, 1).item<float>() == 3.0f);
  CHECK(static_cast<float>(t.select(0, 0).select(0, 0).item<tessera::Half>()) == 0.5f);
  CHECK(static_cast<float>(t.select(0, 1).select(0, 1).item<tessera::BFloat16>()) == 3.0f);
  CHECK_THAT(error_of([&] { t.item<float>(); }),
             Contains("[item] expected a tensor with one element, found shape (2, 2)"));
  CHECK_THAT(error_of([&] { t.item<bool>(); }), Contains("[item]"));
  CHECK(tessera::zeros({0}).to_vector<float>().empty());
}

TEST_CASE("as_strided validates the view against the storage", "[tensor]") {
  Tensor t = iota({6});
  CHECK(values(t.as_strided({2, 2}, {1, 2}, 1)) == std::vector<float>{1, 3, 2, 4});
  CHECK_THAT(error_of([&] {
               t.as_strided({2, 3}, {3, 1}, 1);
             }),
             Contains("[as_strided] view of shape (2, 3)"));
  CHECK_THAT(error_of([&] { t.as_strided({2}, {1, 1}, 0); }), Contains("[as_strided]"));
  CHECK_THAT(error_of([&] { t.as_strided({-1}, {1}, 0); }), Contains("[as_strided]"));
  CHECK(t.as_strided({0, 5}, {5, 1}, 6).numel() == 0);
}

TEST_CASE("autograd state on tensors", "[tensor]") {
  Tensor i = tessera::zeros({2}, {DType::i32});
  CHECK_THAT(error_of([&] { i.set_requires_grad(true); }),
             Contains("[set_requires_grad] only floating-point tensors can require grad, "
                      "found dtype i32"));
  CHECK_NOTHROW(i.set_requires_grad(false));
  Tensor w = tessera::zeros({2, 3});
  CHECK_FALSE(w.requires_grad());
  CHECK(w.is_leaf());
  CHECK_FALSE(w.grad().defined());
  w.set_requires_grad(true);
  CHECK(w.requires_grad());
  // Raw views of a tensor that requires grad would lose the gradient under grad mode.
  CHECK_THAT(error_of([&] { w.transpose(0, 1); }),
             Contains("[transpose] raw view of a tensor that requires grad"));
  CHECK_THAT(error_of([&] { w.view({6}); }), Contains("[view] raw view"));
  CHECK_THAT(error_of([&] { w.narrow(0, 0, 1); }), Contains("[narrow] raw view"));
  CHECK_THAT(error_of([&] { w.reshape({6}); }), Contains("[reshape] raw view"));
  {
    tessera::NoGradGuard no_grad;
    CHECK_FALSE(tessera::GradMode::is_enabled());
    Tensor v = w.transpose(0, 1);
    CHECK(v.shape() == Shape{3, 2});
    CHECK_FALSE(v.requires_grad());
    CHECK(same_storage(v, w));
    CHECK_NOTHROW(w.view({6}));
  }
  CHECK(tessera::GradMode::is_enabled());
  Tensor d = w.detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(same_storage(d, w));
  CHECK(d.transpose(0, 1).shape() == Shape{3, 2});
  CHECK(w.requires_grad());  // detach leaves the original alone

  Tensor g = tessera::ones({2, 3});
  w.set_grad(g);
  CHECK(w.grad().is_same(g));
  CHECK_THAT(error_of([&] { w.set_grad(tessera::ones({3})); }),
             Contains("[set_grad] gradient Tensor(f32, cpu, (3)) does not match tensor"));
  w.set_grad(Tensor());
  CHECK_FALSE(w.grad().defined());
}
