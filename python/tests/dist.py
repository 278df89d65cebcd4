"""A tiny multi-rank runner for tests: ``run(nranks, fn, *args)``.

Starts ``nranks`` processes (torch.multiprocessing; forked from the test
process, which has imported torch already: a spawned child imports it again,
3-4 s of CPU a rank on a small machine; DCPFS_TEST_START=spawn spawns). Each joins a gloo
process group over a FileStore in a fresh temporary folder (no ports to race
for), runs ``fn(rank, world, *args)`` and sends back its (picklable) result.
``run`` returns the results in rank order, or raises an AssertionError
holding the traceback of every rank that failed, died, or was still running
at ``timeout`` seconds (killed and reported as a hang, with the stacks of its
threads five seconds before: faulthandler).

``fn`` must be importable by the children (a module-level function of a test
module or helper). Each child runs with one torch thread (the test machines
have few CPUs) and with the parent's environment.
"""
from __future__ import annotations

import os
import pickle
import queue
import tempfile
import time
import traceback
from typing import Any, Callable, Dict, List

import torch.multiprocessing as mp

__all__ = ["run"]


def _child(rank: int, world: int, store_path: str, fn: Callable[..., Any], args: tuple, q, timeout: float) -> None:
    import datetime
    import faulthandler

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # A rank still running near the deadline writes where each of its threads is, for the report.
    stacks = open(f"{store_path}.stack.{rank}", "w")
    faulthandler.dump_traceback_later(max(1.0, timeout - 5), file=stacks)
    try:
        store = dist.FileStore(store_path, world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout))
        try:
            result = fn(rank, world, *args)
        finally:
            dist.destroy_process_group()
        # plain pickle, not torch's queue reductions: those share tensors
        # through file descriptors that die with this process
        q.put((rank, True, pickle.dumps(result)))
    except BaseException:  # CheckpointException is a BaseException
        q.put((rank, False, traceback.format_exc()))


def run(nranks: int, fn: Callable[..., Any], *args: Any, timeout: float = 120) -> List[Any]:
    """Run ``fn(rank, nranks, *args)`` on ``nranks`` gloo ranks; their results in rank order."""
    ctx = mp.get_context(os.environ.get("DCPFS_TEST_START", "fork"))
    q = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="dcpfs-dist-") as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_child, args=(r, nranks, store, fn, args, q, timeout), daemon=True)
                 for r in range(nranks)]
        for p in procs:
            p.start()
        results: Dict[int, Any] = {}
        failures: Dict[int, str] = {}
        deadline = time.monotonic() + timeout
        dead_since: Dict[int, float] = {}
        while len(results) + len(failures) < nranks and time.monotonic() < deadline:
            try:
                rank, ok, payload = q.get(timeout=0.2)
                if ok:
                    results[rank] = pickle.loads(payload)
                else:
                    failures[rank] = payload
                continue
            except queue.Empty:
                pass
            now = time.monotonic()
            for r, p in enumerate(procs):
                if r in results or r in failures or p.is_alive():
                    continue
                # exited without a result: give its queued message a moment to arrive
                if now - dead_since.setdefault(r, now) > 2:
                    failures[r] = f"exited with code {p.exitcode} without a result"
        for r, p in enumerate(procs):
            if r not in results and r not in failures:
                failures[r] = f"still running after {timeout:g} s: a hang (killed)"
                try:
                    with open(f"{store}.stack.{r}") as f:
                        where = f.read().strip()
                    if where:
                        failures[r] += f"; {timeout - 5:g} s in, its threads were at:\n{where}"
                except OSError:
                    pass
            if p.is_alive():
                p.kill()
            p.join(5)
        q.close()
    if failures:
        text = "\n".join(f"--- rank {r} of {nranks} ---\n{failures[r]}" for r in sorted(failures))
        raise AssertionError(f"{getattr(fn, '__name__', fn)}: {len(failures)} of {nranks} ranks failed:\n{text}")
    return [results[r] for r in range(nranks)]
