#!/usr/bin/python3
"""Writes tests/models/data/safetensors_fixture.safetensors: one small tensor of every dtype
Tessera reads, produced outside Tessera (torch tensors, bytes laid out here with struct and
json) so the C++ reader is checked against an independent writer.

Like the reference writer, the data is ordered by dtype size (largest first) and then by
name, the JSON header lists the keys alphabetically with "__metadata__" among them, and
the header is padded with spaces to a multiple of 8. So the header order differs from the
data order, which is the order read_safetensors returns.

Run with Debian's torch:  /usr/bin/python3 tools/golden/make_safetensors_fixture.py
"""

import json
import math
import os
import struct
import sys

import torch

DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL",
}

# Values the C++ test states again by hand.
TENSORS = {
    "a.f64": torch.tensor([math.pi, -math.e], dtype=torch.float64),
    "b.f32": torch.arange(6, dtype=torch.float32).reshape(2, 3) * 0.5 - 1.0,
    "c.f16": torch.tensor([[1.5, -2.25], [65504.0, 0.0]], dtype=torch.float16),
    "d.bf16": torch.tensor([1.0, -3.5, 1.0e38], dtype=torch.bfloat16),
    "e.i64": torch.tensor([-(2 ** 40), 5], dtype=torch.int64),
    "f.i32": torch.tensor([[-7], [0], [2 ** 31 - 1]], dtype=torch.int32),
    "g.u8": torch.tensor([0, 255, 7], dtype=torch.uint8),
    "h.bool": torch.tensor([True, False, True], dtype=torch.bool),
    "scalar": torch.tensor(42.0, dtype=torch.float32),
    "empty": torch.zeros(0, 3, dtype=torch.float32),
}
METADATA = {"format": "pt", "producer": "tools/golden/make_safetensors_fixture.py"}


def raw_bytes(t):
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: take the upper half of float32
        bits = t.float().contiguous().view(torch.int32).numpy().tobytes()
        return b"".join(bits[i + 2:i + 4] for i in range(0, len(bits), 4))
    return t.contiguous().numpy().tobytes()


def main():
    out = os.path.normpath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "models", "data",
        "safetensors_fixture.safetensors"))
    order = sorted(TENSORS, key=lambda n: (-TENSORS[n].element_size(), n))
    header = {"__metadata__": METADATA}
    blobs = []
    offset = 0
    for name in order:
        t = TENSORS[name]
        data = raw_bytes(t)
        assert len(data) == t.numel() * t.element_size()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)
    print(f"wrote {out}: {os.path.getsize(out)} bytes, data order {order}")


if __name__ == "__main__":
    main()
