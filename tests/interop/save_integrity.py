"""A Megatron-Core checkpoint with its integrity.json, for tests/integrity-manifest.sh.

save OUT    (megatron-core 0.18 or later first on PYTHONPATH) writes the GPTModel of
            megatron_releases.py from one gloo rank with dist_checkpointing.save(...,
            verify_integrity=True): the torch_dist files and integrity.json, each file's
            SHA-256 (megatron/core/dist_checkpointing/validation.py save_integrity_manifest).
verify CKPT Megatron-Core's own check of CKPT's integrity.json (_verify_integrity_manifest_impl):
            exit 0 when it passes, 1 with its message when it raises.
"""
import os
import sys

import torch.multiprocessing as mp

from export_megatron import free_port   # this folder is the script's, first on sys.path
import megatron_releases as mr


def worker(rank, world, port, out):
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    mr.init(rank, world, port, 1)
    sd = mr.build().sharded_state_dict()
    sd["iteration"] = 1000
    os.makedirs(out)
    dist_checkpointing.save(sd, out, get_default_save_sharded_strategy(), verify_integrity=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    what, path = sys.argv[1], sys.argv[2]
    if what == "save":
        import megatron.core.models.gpt.gpt_layer_specs  # noqa: F401 (imported once, before the fork)
        mp.start_processes(worker, args=(1, free_port(), path), nprocs=1, join=True, start_method="fork")
        print(f"saved {sorted(os.listdir(path))}")
    else:
        from megatron.core.dist_checkpointing.validation import _verify_integrity_manifest_impl
        try:
            _verify_integrity_manifest_impl(path)
        except Exception as e:   # CheckpointingException
            print(f"megatron-core: {e}")
            sys.exit(1)
        print("megatron-core: integrity verified")


if __name__ == "__main__":
    main()
