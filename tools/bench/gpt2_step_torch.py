"""PyTorch reference for tools/bench/gpt2_step_bench: one GPT-2 124M training step.

The same model as Tessera's Gpt(GptConfig::preset("gpt2")): token and position embeddings,
12 pre-LayerNorm blocks (causal self-attention written out as masked softmax, since torch
1.13 has no scaled_dot_product_attention; GELU with the tanh approximation), a final
LayerNorm and a head tied to the token embedding, vocabulary padded to 50304. fp32, or with
--dtype bf16 the forward and loss under CPU bf16 autocast (fp32 parameters, gradients and
optimizer: PyTorch's own mixed precision on the CPU); AdamW (lr 1e-4, weight decay 0.1 on
the 2-D weights only), random tokens.

Prints one machine-readable line for the C++ bench to parse:
  TORCH_RESULT {"median_s": ..., "mean_s": ..., "forward_s": ..., ...}

With --serve it instead takes its steps when asked, so the bench can interleave them with
its own (a drift in the shared host's speed then hits both alike): after the warm-up it
prints TORCH_READY {...}; each line "steps N" on stdin runs N timed steps and prints
TORCH_STEPS {"step_s": [...], "forward_s": [...], "backward_s": [...], "optimizer_s": [...]};
"done" (or the end of stdin) prints TORCH_RESULT over all the steps taken and exits.

Run with OPENBLAS_CORETYPE=SKYLAKEX: without it Debian's OpenBLAS falls back to an SSE3
kernel ~5x slower (measured on these hosts). Which OpenBLAS torch loads
(Debian's alternatives: pthread, OpenMP or the netlib reference BLAS) changes the result
several-fold, so the result names it; the bench picks the OpenMP build, the one that shares
torch's threading runtime.
"""

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, n_head, block_size):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.attn_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)
        mask = torch.tril(torch.ones(block_size, block_size, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, block_size, block_size), persistent=False)

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)  # (B, H, T, D)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, H, T, T)
        att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.attn_proj(y)

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab=50304, block_size=1024, n_layer=12, n_head=12, c=768, block=Block):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(block_size, c)
        self.h = nn.ModuleList([block(c, n_head, block_size) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(c)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx, targets, vocab_size):
        t = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head, (B, T, Vp)
        real = logits[:, :, :vocab_size]  # the padding is never predicted
        return F.cross_entropy(real.reshape(-1, vocab_size), targets.reshape(-1))


def blas_library():
    """The BLAS shared library torch loaded (Debian's alternatives pick it at run time)."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "blas" in line.lower() and "/" in line}
    return ", ".join(sorted(paths)) or "unknown"


def emit(tag, obj):
    print(tag + " " + json.dumps(obj), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--serve", action="store_true", help="take steps when asked on stdin")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                    help="bf16: the forward and loss under torch.autocast('cpu', bfloat16)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)
    rss_start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    vocab, padded = 50257, 50304
    model = Gpt(vocab=padded)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-4, foreach=False)
    gen = torch.Generator().manual_seed(1234)
    idx = torch.randint(0, vocab, (args.batch, args.seq), generator=gen)
    targets = torch.randint(0, vocab, (args.batch, args.seq), generator=gen)

    times = {"step_s": [], "forward_s": [], "backward_s": [], "optimizer_s": []}
    loss = None

    def run(n):
        """Runs n steps; returns their phase times."""
        nonlocal loss
        out = {key: [] for key in times}
        for _ in range(n):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
                loss = model(idx, targets, vocab)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            opt.step()
            t3 = time.perf_counter()
            out["step_s"].append(t3 - t0)
            out["forward_s"].append(t1 - t0)
            out["backward_s"].append(t2 - t1)
            out["optimizer_s"].append(t3 - t2)
        return out

    def take(n):
        steps = run(n)
        for key, values in steps.items():
            times[key].extend(values)
        return steps

    meta = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "blas": blas_library(),
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""),
        "dtype": args.dtype,
        "params": n_params,
    }
    run(args.warmup)
    if args.serve:
        emit("TORCH_READY", meta)
        for line in sys.stdin:
            words = line.split()
            if words == ["done"]:
                break
            if len(words) != 2 or words[0] != "steps" or not words[1].isdigit():
                print(f"gpt2_step_torch: expected 'steps N' or 'done', found {line.strip()!r}",
                      file=sys.stderr, flush=True)
                return 2
            emit("TORCH_STEPS", take(int(words[1])))
    else:
        take(args.steps)
    if not times["step_s"]:
        print("gpt2_step_torch: no timed steps were taken", file=sys.stderr, flush=True)
        return 2
    emit("TORCH_RESULT", dict(meta, **{
        "median_s": statistics.median(times["step_s"]),
        "mean_s": statistics.mean(times["step_s"]),
        "forward_s": statistics.median(times["forward_s"]),
        "backward_s": statistics.median(times["backward_s"]),
        "optimizer_s": statistics.median(times["optimizer_s"]),
        "loss": float(loss),
        "rss_start_bytes": rss_start,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
