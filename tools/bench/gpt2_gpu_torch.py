"""PyTorch reference for tools/bench/gpt2_gpu_bench: GPT-2 124M training steps on one CUDA GPU.

The model of tools/bench/gpt2_step_torch.py, imported from it (Tessera's Gpt(GptConfig::preset("gpt2"))):
token and position embeddings, 12 pre-LayerNorm blocks with causal self-attention (here
F.scaled_dot_product_attention(is_causal=True), PyTorch's flash/efficient kernels), GELU with
the tanh approximation, no dropout, a final LayerNorm and a head tied to the token embedding,
vocabulary padded to 50304. AdamW (lr 1e-4, weight decay 0.1 on the 2-D weights only)
after clip_grad_norm_ (--clip, default 1.0, as the C++ bench),
random tokens, eager mode, or with --compile the model through torch.compile (default mode;
the warm-up steps include the compilation).

Precision (--dtype), PyTorch's standard mixed precision: the parameters, gradients and AdamW
state stay f32 and torch.autocast runs the matrix products in bf16 or fp16; fp16 adds
torch.amp.GradScaler (dynamic loss scaling). f32 runs enable TF32 matrix products, as
Tessera's f32 GEMMs use TF32. The optimizer is torch.optim.AdamW(fused=True).

Each step synchronizes the device at its start and after forward + loss, backward and the
optimizer step, as the C++ bench does. Prints one JSON line for the bench to parse:
  {"tokens_per_s": ..., "step_ms": ..., "peak_mem_bytes": ..., ...}
"""

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

# The model of the CPU reference; this script's directory is on sys.path when it runs.
import gpt2_step_torch as ref


class FusedBlock(ref.Block):
    """The reference block with F.scaled_dot_product_attention (no (T, T) matrix)."""

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)  # (B, H, T, D)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        return self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, c))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dtype", choices=["bf16", "fp16", "f32"], default="bf16")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--compile", action="store_true", help="run the model through torch.compile")
    ap.add_argument("--clip", type=float, default=1.0,
                    help="clip_grad_norm_ max_norm (0: none), after unscale_ with fp16")
    args = ap.parse_args()

    if not torch.cuda.is_available():
        print("gpt2_gpu_torch: error: torch sees no CUDA device", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    torch.cuda.set_device(device)
    torch.manual_seed(1337)
    # Tessera's f32 GEMMs use TF32 tensor cores; so does this reference.
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    vocab, padded = 50257, 50304
    model = ref.Gpt(vocab=padded, block=FusedBlock).to(device)  # f32 parameters in every mode
    n_params = sum(p.numel() for p in model.parameters())
    step_model = torch.compile(model) if args.compile else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-4, fused=True)
    # PyTorch's standard mixed precision: autocast over f32 parameters (+ GradScaler for fp16).
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "f32": None}[args.dtype]
    scaler = torch.amp.GradScaler("cuda") if args.dtype == "fp16" else None
    gen = torch.Generator().manual_seed(1234)
    idx = torch.randint(0, vocab, (args.batch, args.seq), generator=gen).to(device)
    targets = torch.randint(0, vocab, (args.batch, args.seq), generator=gen).to(device)

    steps, fwd, bwd, optim = [], [], [], []
    loss = None
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = step_model(idx, targets, vocab)
        torch.cuda.synchronize(device)
        t1 = time.perf_counter()
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        torch.cuda.synchronize(device)
        t2 = time.perf_counter()
        if scaler is not None:
            if args.clip > 0:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            scaler.step(opt)
            scaler.update()
        else:
            if args.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
        torch.cuda.synchronize(device)
        t3 = time.perf_counter()
        if i >= args.warmup:
            steps.append(t3 - t0)
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            optim.append(t3 - t2)
    step_s = statistics.median(steps)
    result = {
        "tokens_per_s": args.batch * args.seq / step_s,
        "step_ms": 1e3 * step_s,
        "peak_mem_bytes": torch.cuda.max_memory_allocated(device),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(device),
        "mean_step_ms": 1e3 * statistics.mean(steps),
        "forward_ms": 1e3 * statistics.median(fwd),
        "backward_ms": 1e3 * statistics.median(bwd),
        "optimizer_ms": 1e3 * statistics.median(optim),
        "loss": float(loss),
        "params": n_params,
        "dtype": args.dtype,
        "compiled": args.compile,
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(device),
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
