"""PyTorch reference for tools/bench/cuda_kernels_bench: causal attention on one CUDA GPU.

F.scaled_dot_product_attention(q, k, v, is_causal=True) on (B, H, T, D) tensors, PyTorch's
fused kernels (flash, cuDNN or memory-efficient, as it picks), timed the way the C++ bench
times Tessera's kernels: --warmup untimed calls, then the median of 3 rounds of --reps
back-to-back calls, the device synchronized before and after each round. The backward is
torch.autograd.grad of one forward's output, repeated with the graph retained. The
"_dropout_" timings are the same calls with dropout_p=--dropout (default 0.1) on the
probabilities.
Prints one JSON line: {"attention_forward_ms": ..., "attention_backward_ms": ..., ...}.
"""

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def median_ms(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    rounds = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - t0) * 1e3 / reps)
    return statistics.median(rounds)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", choices=["bf16", "fp16", "f32"], default="bf16")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--dropout", type=float, default=0.1)
    a = p.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "f32": torch.float32}[a.dtype]
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device(a.device)
    shape = (a.batch, a.heads, a.seq, a.head_dim)
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v, dout = (torch.randn(shape, device=dev, dtype=dtype, generator=gen) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)

    def timings(dropout_p):
        def forward():
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)

        forward_ms = median_ms(forward, a.warmup, a.reps)
        out = forward()
        backward_ms = median_ms(
            lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), a.warmup,
            a.reps)
        return forward_ms, backward_ms

    forward_ms, backward_ms = timings(0.0)
    dropout_forward_ms, dropout_backward_ms = timings(a.dropout)
    print(json.dumps({
        "attention_forward_ms": forward_ms,
        "attention_backward_ms": backward_ms,
        "attention_dropout_forward_ms": dropout_forward_ms,
        "attention_dropout_backward_ms": dropout_backward_ms,
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(dev),
    }))


if __name__ == "__main__":
    main()
