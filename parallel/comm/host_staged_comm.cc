#include "parallel/comm/host_staged_comm.h"

#include <utility>

#include "core/factories.h"

namespace tessera::parallel {
namespace {

class HostStagedCommunicator final : public Communicator {
 public:
  // Over `inner`, owned by `owned` when this object made it (a split), else by the caller.
  HostStagedCommunicator(Communicator& inner, std::unique_ptr<Communicator> owned)
      : Communicator(inner.rank(), inner.size(), inner.name(), inner.options()),
        inner_(inner),
        owned_(std::move(owned)) {}

 protected:
  void do_all_reduce(const Tensor& t, ReduceOp op) override {
    const Tensor h = on_host(t);
    inner_.all_reduce(h, op);
    write_back(t, h);
  }
  void do_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    const Tensor h = host_like(out);
    inner_.reduce_scatter(on_host(in), h, op);
    write_back(out, h);
  }
  void do_all_gather(const Tensor& in, const Tensor& out) override {
    const Tensor h = host_like(out);
    inner_.all_gather(on_host(in), h);
    write_back(out, h);
  }
  void do_all_to_all(const Tensor& in, const Tensor& out) override {
    const Tensor h = host_like(out);
    inner_.all_to_all(on_host(in), h);
    write_back(out, h);
  }
  void do_broadcast(const Tensor& t, int root) override {
    const Tensor h = on_host(t);
    inner_.broadcast(h, root);
    write_back(t, h);
  }
  void do_send(const Tensor& t, int dst) override { inner_.send(on_host(t), dst); }
  void do_recv(const Tensor& t, int src) override {
    const Tensor h = host_like(t);
    inner_.recv(h, src);
    write_back(t, h);
  }
  void do_barrier() override { inner_.barrier(); }
  std::unique_ptr<Communicator> do_split(int color, int key) override {
    std::unique_ptr<Communicator> child = inner_.split(color, key);
    if (!child) return nullptr;
    Communicator& ref = *child;
    return std::make_unique<HostStagedCommunicator>(ref, std::move(child));
  }
  bool supports(Device) const override { return true; }
  // The device copies belong to the caller's device and stream.
  bool runs_on_any_thread() const override { return false; }
  bool reduces_16_bit() const override { return true; }  // the inner backend, on the host

 private:
  // t itself on the host, else a contiguous host copy.
  static Tensor on_host(const Tensor& t) { return t.device().is_cpu() ? t : t.to(Device::cpu()); }
  // t itself on the host, else an uninitialized host tensor of its shape and dtype.
  static Tensor host_like(const Tensor& t) {
    return t.device().is_cpu() ? t : empty(t.shape(), {t.dtype(), Device::cpu()});
  }
  static void write_back(const Tensor& t, const Tensor& h) {
    if (!t.device().is_cpu()) t.copy_(h);
  }

  Communicator& inner_;
  std::unique_ptr<Communicator> owned_;
};

}  // namespace

std::unique_ptr<Communicator> host_staged(Communicator& inner) {
  return std::make_unique<HostStagedCommunicator>(inner, nullptr);
}

}  // namespace tessera::parallel
