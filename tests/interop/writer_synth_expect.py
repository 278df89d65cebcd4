#!/usr/bin/env python3
"""The contents `dcp synth` writes (dcp-synth(1)), computed independently.

usage: writer_synth_expect.py SEED KEY NBYTES [bool]   -> sha256 of key KEY's C-order bytes
As a module: synth_bytes(seed, key, nbytes, is_bool=False) -> bytes.
"""
import hashlib, sys

G = 0x9E3779B97F4A7C15
M = (1 << 64) - 1


def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return z ^ (z >> 31)


def synth_bytes(seed, key, nbytes, is_bool=False):
    try:
        import numpy as np
        base = np.uint64(mix((seed + key * G) & M))
        with np.errstate(over="ignore"):
            j = np.arange(1, (nbytes + 7) // 8 + 1, dtype=np.uint64)
            z = base + j * np.uint64(G)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
        out = z.astype("<u8").tobytes()[:nbytes]
        if is_bool:
            out = (np.frombuffer(out, dtype=np.uint8) & 1).tobytes()
        return out
    except ImportError:
        base = mix((seed + key * G) & M)
        out = bytearray()
        for j in range((nbytes + 7) // 8):
            out += mix((base + (j + 1) * G) & M).to_bytes(8, "little")
        out = bytes(out[:nbytes])
        return bytes(b & 1 for b in out) if is_bool else out


if __name__ == "__main__":
    seed, key, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    print(hashlib.sha256(synth_bytes(seed, key, n, len(sys.argv) > 4 and sys.argv[4] == "bool")).hexdigest())
