#!/usr/bin/env python3
"""Write a torch.save file with real PyTorch, and its ground truth, for tests/load-file.sh.

usage: load_torch_save.py OUT_DIR
OUT_DIR/model.pt: a nested state dict of tensors of several dtypes and ranks, views sharing one
storage (a row slice, a strided column slice), a transposed tensor (stored strides), a 0-d and an
empty tensor, and non-tensor values (left out by the loader). OUT_DIR/truth.json maps each tensor
key to kind, dtype, shape and the sha256 of its C-order bytes (load_check.py's format);
OUT_DIR/unique holds the number of storage bytes the tensors' elements occupy (their union per
storage): what the ranks together must read, once.
"""
import hashlib, json, os, sys

import numpy as np
import torch

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
g = torch.Generator().manual_seed(6)
w = torch.randn(9, 7, generator=g)
sd = {
    "w": w,
    "w_rows": w[2:6],                 # shares w's storage: read once
    "w_cols": w[:, 1::3],             # strided view of the same storage
    "emb": torch.randn(11, 5, generator=g).to(torch.bfloat16),
    "h": torch.randn(4, 3, 5, generator=g).half(),
    "idx": torch.randint(-2**40, 2**40, (13,), generator=g),
    "step": torch.tensor(7),
    "mask": torch.rand(6, 4, generator=g) > 0.5,
    "t": torch.randn(5, 8, generator=g).t(),
    "empty": torch.zeros(0, 3),
    "cplx": torch.randn(4, 4, dtype=torch.complex64, generator=g),
    "opt": {"m": torch.randn(10, 2, generator=g, dtype=torch.float64), "lr": 0.1},
    "epoch": 3,
    "name": "run-6",
}
torch.save(sd, os.path.join(out, "model.pt"))


def flat(d, prefix=""):
    for k, v in d.items():
        key = prefix + k
        if isinstance(v, dict):
            yield from flat(v, key + ".")
        elif isinstance(v, torch.Tensor):
            yield key, v


truth, spans = {}, {}
for key, t in flat(sd):
    c = t.contiguous()
    data = c.reshape(-1).view(torch.uint8).numpy().tobytes() if c.numel() else b""
    truth[key] = {"kind": "tensor", "dtype": str(t.dtype), "shape": list(t.shape),
                  "sha256": hashlib.sha256(data).hexdigest()}
    if t.numel() == 0:
        continue
    isz = t.element_size()
    addr = np.array(t.storage_offset(), dtype=np.int64)
    for d, (s, k) in enumerate(zip(t.shape, t.stride())):
        shape = [1] * t.dim()
        shape[d] = s
        addr = addr + (np.arange(s, dtype=np.int64) * k).reshape(shape)
    spans.setdefault(t.untyped_storage().data_ptr(), set()).update((np.unique(addr) * isz).tolist())
    spans[t.untyped_storage().data_ptr(), "isz"] = isz
unique = 0
for k, starts in spans.items():
    if isinstance(k, tuple):
        continue
    isz = spans[k, "isz"]
    end = -1
    for a in sorted(starts):   # elements of one storage share one size here
        unique += min(isz, a + isz - end) if a < end else isz
        end = max(end, a + isz)
with open(os.path.join(out, "truth.json"), "w") as f:
    json.dump(truth, f, indent=1)
with open(os.path.join(out, "unique"), "w") as f:
    f.write(f"{unique}\n")
