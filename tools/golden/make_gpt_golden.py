#!/usr/bin/python3
"""Writes tests/models/data/gpt_golden.safetensors: reference numbers for Tessera's GPT-2.

A minimal GPT-2 in plain PyTorch (no transformers, no safetensors package): token and
position embeddings, pre-LayerNorm blocks with causal self-attention (q, k, v from one
c_attn Linear, heads split as view(B, T, H, D).transpose(1, 2), scale 1/sqrt(D)), an MLP
of width 4C with the tanh GELU (HF "gelu_new"), a final ln_f and an LM head tied to wte.
LayerNorm eps 1e-5, biases everywhere, no dropout, float32.

The file holds, all little-endian:
  transformer.*            initial weights, Hugging Face names and layout (Conv1D weights
                           (in, out), wte (vocab_size, C) unpadded, no lm_head: tied)
  golden.idx, .targets     I64 (B, T) inputs and targets
  golden.logits            F32 (B, T, vocab_size) from the initial weights
  golden.loss              F32 () mean cross-entropy of those logits
  grad.<name>              gradients of the loss, HF layout
  golden.adamw_losses      F32 (STEPS,) the loss before each AdamW step on the same batch
  final.<name>             weights after STEPS AdamW steps, HF layout
and __metadata__ with the config and optimizer settings.

Run with Debian's torch:  /usr/bin/python3 tools/golden/make_gpt_golden.py
"""

import json
import math
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIG = {
    "vocab_size": 101,
    "block_size": 17,
    "n_layer": 3,
    "n_head": 3,
    "n_embd": 48,
    "layer_norm_eps": 1e-5,
    "bias": True,
    "tie_word_embeddings": True,
    "dropout": 0.0,
}
BATCH, SEQ = 2, 17
SEED = 20240611
ADAMW = {"lr": 3e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
STEPS = 5
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                   "mlp.c_proj.weight")


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


class CausalSelfAttention(nn.Module):
    def __init__(self, c, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)

    def forward(self, x):
        b, t, c = x.shape
        h, d = self.n_head, c // self.n_head
        q, k, v = self.c_attn(x).split(c, dim=2)
        q = q.view(b, t, h, d).transpose(1, 2)  # (B, H, T, D)
        k = k.view(b, t, h, d).transpose(1, 2)
        v = v.view(b, t, h, d).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))  # (B, H, T, T)
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = F.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c, 4 * c)
        self.c_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        return self.c_proj(gelu_tanh(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c, eps = cfg["n_embd"], cfg["layer_norm_eps"]
        self.ln_1 = nn.LayerNorm(c, eps=eps)
        self.attn = CausalSelfAttention(c, cfg["n_head"])
        self.ln_2 = nn.LayerNorm(c, eps=eps)
        self.mlp = Mlp(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = cfg["n_embd"]
        self.transformer = nn.ModuleDict({
            "wte": nn.Embedding(cfg["vocab_size"], c),
            "wpe": nn.Embedding(cfg["block_size"], c),
            "h": nn.ModuleList(Block(cfg) for _ in range(cfg["n_layer"])),
            "ln_f": nn.LayerNorm(c, eps=cfg["layer_norm_eps"]),
        })
        self.lm_head = nn.Linear(c, cfg["vocab_size"], bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied

    def forward(self, idx):
        _, t = idx.shape
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))  # (B, T, V)


def init_weights(model, cfg):
    """GPT-2 init, then noise on LayerNorm parameters and biases so none is trivially 1/0."""
    resid_std = 0.02 / math.sqrt(2 * cfg["n_layer"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("c_proj.weight"):
                p.normal_(0.0, resid_std)
            elif ".ln_" in name or name.startswith("transformer.ln_f"):
                if name.endswith(".weight"):
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
                else:
                    p.copy_(0.05 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.02 * torch.randn_like(p))
            else:  # Linear weights and the embeddings
                p.normal_(0.0, 0.02)


def hf_layout(name, t):
    """Tessera/nn.Linear (out, in) -> Hugging Face Conv1D (in, out) where HF transposes."""
    t = t.detach().clone()
    return t.t().contiguous() if name.endswith(CONV1D_SUFFIXES) else t


def loss_of(model, idx, targets):
    logits = model(idx)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
    return logits, loss


DTYPES = {torch.float32: "F32", torch.int64: "I64"}


def write_safetensors(path, tensors, metadata):
    """The safetensors format by hand: u64 header length, JSON header padded with spaces
    to a multiple of 8, then the tensors' bytes back to back in the given order."""
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name, t in tensors:
        data = t.detach().contiguous().numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)
    os.replace(tmp, path)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "models", "data",
        "gpt_golden.safetensors")
    out = os.path.normpath(out)
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    cfg = CONFIG
    probe = torch.linspace(-6.0, 6.0, 101)  # our GELU is PyTorch's tanh approximation
    assert torch.allclose(gelu_tanh(probe), F.gelu(probe, approximate="tanh"), atol=1e-6)
    model = Gpt(cfg)
    init_weights(model, cfg)
    names = [n for n, _ in model.named_parameters()]  # lm_head.weight is wte: listed once
    assert "lm_head.weight" not in names
    idx = torch.randint(0, cfg["vocab_size"], (BATCH, SEQ), dtype=torch.int64)
    targets = torch.randint(0, cfg["vocab_size"], (BATCH, SEQ), dtype=torch.int64)

    initial = [(n, hf_layout(n, p)) for n, p in model.named_parameters()]
    logits, loss = loss_of(model, idx, targets)
    loss.backward()
    grads = [("grad." + n, hf_layout(n, p.grad)) for n, p in model.named_parameters()]

    opt = torch.optim.AdamW(model.parameters(), lr=ADAMW["lr"], betas=ADAMW["betas"],
                            eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"], foreach=False)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        _, step_loss = loss_of(model, idx, targets)
        losses.append(step_loss.item())
        step_loss.backward()
        opt.step()
    assert losses[0] == loss.item()
    final = [("final." + n, hf_layout(n, p)) for n, p in model.named_parameters()]

    tensors = initial + [
        ("golden.idx", idx),
        ("golden.targets", targets),
        ("golden.logits", logits.detach()),
        ("golden.loss", loss.detach().reshape(())),
    ] + grads + [("golden.adamw_losses", torch.tensor(losses, dtype=torch.float32))] + final
    tessera_config = {"type": "gpt2", **{k: cfg[k] for k in (
        "vocab_size", "block_size", "n_layer", "n_head", "n_embd", "dropout", "bias",
        "tie_word_embeddings", "layer_norm_eps")}}
    metadata = {
        "format": "pt",
        "tessera.gpt_config": json.dumps(tessera_config),
        "model": ("GPT-2, pre-LN, causal attention scale 1/sqrt(D), gelu tanh approximation, "
                  "MLP 4C, tied lm_head, LayerNorm eps 1e-5, biases, no dropout, float32"),
        "batch": json.dumps({"B": BATCH, "T": SEQ}),
        "loss": "mean cross-entropy over all B*T positions (vocab_size logits, unpadded)",
        "optimizer": json.dumps({
            "type": "torch.optim.AdamW", "lr": ADAMW["lr"], "betas": list(ADAMW["betas"]),
            "eps": ADAMW["eps"], "weight_decay": ADAMW["weight_decay"],
            "weight_decay_applies_to": "all parameters", "steps": STEPS,
            "schedule": "constant lr, no gradient clipping, same batch every step"}),
        "seed": str(SEED),
        "torch_version": torch.__version__,
        "generator": "tools/golden/make_gpt_golden.py",
    }
    write_safetensors(out, tensors, metadata)
    print(f"wrote {out}: {len(tensors)} tensors, {os.path.getsize(out)} bytes, "
          f"loss {loss.item():.6f}, adamw losses {[round(x, 6) for x in losses]}")


if __name__ == "__main__":
    main()
