#!/usr/bin/env python3
"""The device-to-device half of bench-gpu.sh's baseline (issue 16).

usage: gpu_d2d.py BYTES N [REPS]

Allocates one source buffer of BYTES on device 0 and N destinations of BYTES,
destination i on device i mod the device count (N ranks of one node on one
GPU: all on device 0; on N GPUs: peer copies), then times N copies of the
whole source into the destinations (cudaMemcpyPeerAsync on one stream,
cudaEvent timing), best of REPS (default 3). Prints the seconds. It calls
libcudart through ctypes, so the tree holds no CUDA code outside src/load.
Exits 77 without a usable GPU.
"""
import ctypes, ctypes.util, os, sys


def load_cudart():
    names = [ctypes.util.find_library("cudart"), "libcudart.so"]
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    names += [os.path.join(cuda, "lib64", f) for f in sorted(os.listdir(os.path.join(cuda, "lib64")))
              if f.startswith("libcudart.so")] if os.path.isdir(os.path.join(cuda, "lib64")) else []
    for n in names:
        if not n:
            continue
        try:
            return ctypes.CDLL(n)
        except OSError:
            continue
    return None


def main():
    size, n = int(sys.argv[1]), int(sys.argv[2])
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    rt = load_cudart()
    if rt is None:
        print("gpu_d2d: no libcudart", file=sys.stderr)
        return 77
    count = ctypes.c_int(0)
    if rt.cudaGetDeviceCount(ctypes.byref(count)) != 0 or count.value < 1:
        print("gpu_d2d: no usable GPU", file=sys.stderr)
        return 77

    def check(rc, what):
        if rc != 0:
            rt.cudaGetErrorString.restype = ctypes.c_char_p
            raise SystemExit(f"gpu_d2d: {what}: {rt.cudaGetErrorString(rc).decode()}")

    ndev = count.value
    bufs = []
    for i in range(n + 1):
        dev = 0 if i == 0 else (i - 1) % ndev
        check(rt.cudaSetDevice(dev), "cudaSetDevice")
        p = ctypes.c_void_p()
        check(rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(size)), f"cudaMalloc of {size} bytes")
        check(rt.cudaMemset(p, i, ctypes.c_size_t(size)), "cudaMemset")
        bufs.append((dev, p))
    check(rt.cudaSetDevice(0), "cudaSetDevice")
    check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
    stream = ctypes.c_void_p()
    check(rt.cudaStreamCreate(ctypes.byref(stream)), "cudaStreamCreate")
    start, stop = ctypes.c_void_p(), ctypes.c_void_p()
    check(rt.cudaEventCreate(ctypes.byref(start)), "cudaEventCreate")
    check(rt.cudaEventCreate(ctypes.byref(stop)), "cudaEventCreate")
    best = None
    for _ in range(reps):
        check(rt.cudaEventRecord(start, stream), "cudaEventRecord")
        for dev, p in bufs[1:]:
            check(rt.cudaMemcpyPeerAsync(p, dev, bufs[0][1], 0, ctypes.c_size_t(size), stream), "cudaMemcpyPeerAsync")
        check(rt.cudaEventRecord(stop, stream), "cudaEventRecord")
        check(rt.cudaEventSynchronize(stop), "cudaEventSynchronize")
        ms = ctypes.c_float(0)
        check(rt.cudaEventElapsedTime(ctypes.byref(ms), start, stop), "cudaEventElapsedTime")
        best = ms.value / 1e3 if best is None else min(best, ms.value / 1e3)
    for dev, p in bufs:
        rt.cudaSetDevice(dev)
        rt.cudaFree(p)
    print(f"{best:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
