"""The worker of tests/python-load-torchrun.sh: dcpfs.torch.load under
torchrun (gloo), one failure at a time, every rank printing one line a case:
``RESULT <rank> <case> ok`` or ``RESULT <rank> <case> error <message>``.

    torchrun --standalone --nproc-per-node 2 load_torchrun.py CKPT OTHER CASES

CKPT was saved by ``make`` (below); OTHER is a copy of it with a shard cut
short. CASES, comma-separated, run in order in one process group:
  clean     every rank loads every tensor (replicated, an empty one too)
            and checks the values;
  enomem    rank 1 runs out of address space during the load (RLIMIT_AS a
            few MiB above its size, threads of 16 MiB stacks: its read
            threads cannot start);
  other     rank 1 passes OTHER;
  badkey    rank 1 asks for a key the checkpoint lacks;
  unpickle  rank 1 lacks the class of a stored object (as a node without
            the module that defines it): "Can't get attribute 'Obj'";
  subgroup  the load runs over a process group of rank 0 alone: rank 1, not
            in it, is told so at once;
  kill      rank 1 is killed (SIGKILL) as the load starts.
``make CKPT`` saves the checkpoint (no process group).
"""
from __future__ import annotations

import os
import re
import resource
import signal
import sys
import threading
from typing import Dict

from dataclasses import dataclass

import torch


@dataclass
class Obj:
    """A stored object (pickled as __main__.Obj: this script runs as __main__ when saving and under torchrun)."""
    n: int


def values() -> Dict[str, object]:
    """What the checkpoint holds."""
    g = torch.Generator().manual_seed(5)
    return {"a": torch.randn(512, 1024, generator=g), "b": torch.randn(64, 3, generator=g),
            "e": torch.zeros(0, 5), "step": 7, "obj": Obj(3)}


def fresh() -> Dict[str, object]:
    """A state dict to load into: every tensor zeroed, of the saved shape."""
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else None for k, v in values().items()}


def make(path: str) -> None:
    import torch.distributed.checkpoint as dcp
    dcp.save(values(), checkpoint_id=path, no_dist=True)


def one_case(case: str, rank: int, path: str, other: str) -> str:
    """Run one case on this rank; its result line's tail."""
    import dcpfs
    import dcpfs.torch
    sd = fresh()
    limit = None
    if case == "enomem" and rank == 1:
        # threads of 16 MiB stacks (whatever ulimit -s says, and no stack
        # an ended thread left fits them), 4 MiB of address space left
        threading.stack_size(16 << 20)
        size = int(re.search(r"VmSize:\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024
        limit = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (size + (4 << 20), limit[1]))
    if case == "other" and rank == 1:
        path = other
    if case == "badkey" and rank == 1:
        sd["no.such.key"] = torch.zeros(3)
    if case == "kill" and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    main = sys.modules["__main__"]
    hidden = case == "unpickle" and rank == 1
    cls = Obj       # (this module is __main__: its global goes with the attribute)
    if hidden:
        del main.Obj     # type: ignore[attr-defined]
    group = None
    if case == "subgroup":
        import torch.distributed as dist
        group = dist.new_group([0])     # (collective: every rank creates it)
    try:
        dcpfs.torch.load(sd, path, process_group=group)
    except Exception as e:     # (any type: the test wants one agreed DcpError)
        return f"error {type(e).__name__}: {e}"
    finally:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, limit)
            threading.stack_size(0)
        if hidden:
            main.Obj = cls     # type: ignore[attr-defined]
    want = values()
    for k, v in want.items():
        got = sd[k]
        same = torch.equal(got, v) if isinstance(v, torch.Tensor) else got == v
        if not same:
            return f"error wrong value for {k}"
    return "ok"


def main() -> int:
    if sys.argv[1] == "make":
        make(sys.argv[2])
        return 0
    import torch.distributed as dist
    path, other, cases = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for case in cases:
        # one write() of the whole line: the ranks share torchrun's stdout, and print()'s text and
        # newline as two writes (unbuffered) interleaved with the other rank's line (seen in CI:
        # 'RESULT 0 clean okRESULT 1 clean ok')
        os.write(1, f"RESULT {rank} {case} {one_case(case, rank, path, other)}\n".encode())
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
