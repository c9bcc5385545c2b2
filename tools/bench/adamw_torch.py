"""PyTorch reference for tools/bench/offload_bench: torch.optim.AdamW on the CPU.

One f32 parameter of --params elements with a random gradient, stepped by
torch.optim.AdamW (its default implementation for CPU tensors) with --threads threads:
--warmup untimed steps, then the median of --steps timed ones. Prints one JSON line:
{"adamw_params_per_s": ..., "torch": "<version>", "threads": N}.
"""

import argparse
import json
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", type=int, default=20_000_000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(args.params, generator=gen))
    w.grad = torch.randn(args.params, generator=gen)
    opt = torch.optim.AdamW([w], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    for _ in range(args.warmup):
        opt.step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"adamw_params_per_s": args.params / statistics.median(times),
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
