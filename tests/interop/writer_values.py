#!/usr/bin/env python3
"""torch.save values that convert must carry over: conj and neg views, an
nn.Parameter, plain bytes, a list holding bytes.

usage:
  writer_values.py make OUT.pt          torch.save the dict below
  writer_values.py check ORIG.pt ROUND.pt
      ROUND.pt (ORIG.pt converted to DCP and back) holds the same tensors, byte for
      byte as values (conj/neg resolved), and each non-tensor value as a bytes value
      holding its torch.save blob, which torch.load gives back equal to the original.
"""
import io, sys

import torch


def values():
    c = torch.tensor([1 + 2j, 3 - 4j, -5.5 + 0.25j], dtype=torch.complex64).conj()
    n = torch._neg_view(torch.tensor([1.5, -2.0, 3.0, 0.0]))
    assert c.is_conj() and n.is_neg()
    return {
        "conj": c,
        "neg": n,
        "param": torch.nn.Parameter(torch.arange(6, dtype=torch.float32).reshape(2, 3)),
        "plain": torch.arange(5, dtype=torch.int16),
        "raw": b"raw",
        "mixed": [b"x", 1],
    }


def tensor_bytes(t):
    t = t.detach().resolve_conj().resolve_neg().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def main():
    if sys.argv[1] == "make":
        torch.save(values(), sys.argv[2])
        return 0
    orig = torch.load(sys.argv[2], weights_only=True)
    got = torch.load(sys.argv[3], weights_only=True)
    bad = []
    if sorted(orig) != sorted(got):
        bad.append(f"keys {sorted(got)} != {sorted(orig)}")
    for k, v in orig.items():
        g = got.get(k)
        if isinstance(v, torch.Tensor):
            if not isinstance(g, torch.Tensor):
                bad.append(f"{k}: not a tensor: {type(g)}")
            elif g.dtype != v.dtype or g.shape != v.shape or tensor_bytes(g) != tensor_bytes(v):
                bad.append(f"{k}: {g} != {v}")
            elif g.is_conj() or g.is_neg():
                bad.append(f"{k}: still a lazy view")
        else:
            if not isinstance(g, bytes):
                bad.append(f"{k}: {type(g)} is not a bytes value")
                continue
            back = torch.load(io.BytesIO(g), weights_only=True)
            if back != v:
                bad.append(f"{k}: {back!r} != {v!r}")
    for b in bad:
        print("FAIL:", b)
    print("ok" if not bad else f"{len(bad)} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
