"""torchtitan's own export to Hugging Face, as bench/bench-export.sh times it beside dcp convert --to hf.

torchtitan-to-hf.py SRC DST HEADS: loads the DCP checkpoint SRC whole with torch's
torch.distributed.checkpoint.load (one process), renames dcp synth's keys model.layers.L.weight
to torchtitan 0.3's layers.L.attention.qkv_linear.wq.weight, applies torchtitan's
Llama3StateDictAdapter.to_hf (which permutes the rows of wq to Hugging Face's rotary layout, HEADS
heads) and writes DST as torchtitan's checkpointer does for to_hf=True (components/checkpointer/dcp.py):
torch.distributed.checkpoint.save with a HuggingFaceStorageWriter, consolidated into one
model safetensors file. Prints the seconds of each phase on stderr."""
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "interop"))
import export_torchtitan  # noqa: E402,F401  (TORCHDYNAMO_DISABLE, torchtitan's triton-only module)
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint import FileSystemReader, HuggingFaceStorageWriter  # noqa: E402
from torch.distributed.checkpoint.metadata import TensorStorageMetadata  # noqa: E402


def main(src, dst, heads):
    from torchtitan.models import llama3 as L3
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear
    t0 = time.monotonic()
    md = FileSystemReader(src).read_metadata()
    sd = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in md.state_dict_metadata.items()
          if isinstance(m, TensorStorageMetadata)}
    dcp.load(sd, checkpoint_id=src, no_dist=True)
    t1 = time.monotonic()
    sd = {re.sub(r"^model\.layers\.(\d+)\.weight$", r"layers.\1.attention.qkv_linear.wq.weight", k): v
          for k, v in sd.items()}
    dim = next(iter(sd.values())).shape[1]
    cfg = L3.Llama3Model.Config(   # a config only: nothing is allocated
        dim=dim, vocab_size=1, tok_embeddings=Embedding.Config(num_embeddings=1, embedding_dim=dim),
        norm=L3.RMSNorm.Config(normalized_shape=dim), lm_head=Linear.Config(in_features=dim, out_features=1),
        layers=L3._build_llama3_layers(
        n_layers=1, dim=dim, n_heads=heads, hidden_dim=dim, attn_backend="flex",
        rope=ComplexRoPE.Config(dim=dim // heads, max_seq_len=128)))
    hf = L3.Llama3StateDictAdapter(cfg, None).to_hf(sd)
    del sd
    t2 = time.monotonic()
    dcp.save(hf, storage_writer=HuggingFaceStorageWriter(path=dst, save_distributed=True, enable_consolidation=True),
             no_dist=True)
    t3 = time.monotonic()
    print(f"torchtitan-to-hf: load {t1 - t0:.2f} s, to_hf {t2 - t1:.2f} s, save {t3 - t2:.2f} s", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
