"""What `ampkit memory --device cuda --device-memory` costs and predicts on a GPT, without a GPU.

For one model and batch: the predicted peak with the CPU's attention kernels (what a CUDA prediction made on a
CPU used to be) beside the one with CUDA's kernels modelled, then the largest-batch search under a budget: its
answer, how many estimates it made and its wall time.

    python benchmarks/memory_search.py                                   # built-in gpt, size large
    python benchmarks/memory_search.py --hf-gpt2 medium --batch 8 --seq-len 1024 --device-memory 24GiB
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import date
from typing import Any

import torch
import torch.nn.functional as F

from ampkit.memory import _fit as fit_module, estimate
from ampkit.memory._fit import largest_batch, parse_bytes, resize_batch
from ampkit.workloads import get_workload

GiB = 2**30
_GPT2 = {"small": (12, 768, 12), "medium": (24, 1024, 16), "large": (36, 1280, 20)}  # layers, width, heads


def _hf_gpt2(size: str, seq_len: int) -> tuple[torch.nn.Module, Any, Any, str]:
    import transformers

    layers, width, heads = _GPT2[size]
    config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=heads, n_positions=seq_len)
    with torch.device("meta"):  # the estimate needs shapes only: nothing is allocated
        model = transformers.GPT2LMHeadModel._from_config(config, attn_implementation="sdpa")

    def loss_fn(output: Any, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.logits.flatten(0, 1).float(), targets.flatten())

    tokens = torch.empty(1, seq_len, dtype=torch.long, device="meta")
    return model, (tokens, tokens), loss_fn, f"Hugging Face GPT-2-{size} (sdpa, dropout 0.1), T={seq_len}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="large", help="built-in gpt workload size")
    p.add_argument("--hf-gpt2", choices=tuple(_GPT2), help="a randomly initialised Hugging Face GPT-2 instead")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch", type=int, help="batch size of the single estimate (default: the workload's)")
    p.add_argument("--precision", default="bf16-mixed")
    p.add_argument("--device-memory", default="24GiB")
    args = p.parse_args(argv)

    if args.hf_gpt2:
        model, batch, loss_fn, name = _hf_gpt2(args.hf_gpt2, args.seq_len)
        optimizer, clip = (lambda params: torch.optim.AdamW(params, lr=1e-4)), None
    else:
        w = get_workload("gpt", size=args.size, seed=0)
        model, batch, loss_fn, name, optimizer, clip = w.model, w.batch(0), w.loss_fn, w.description, w.optimizer, w.clip_grad_norm
    batch = resize_batch(batch, args.batch or batch[0].shape[0])
    options = {"loss_fn": loss_fn, "clip_grad_norm": clip}
    print(f"# memory search, {date.today()}, torch {torch.__version__}, CPU only (CUDA visible: {torch.cuda.is_available()})")
    print(f"# command: python benchmarks/memory_search.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"# {name}; policy {args.precision}, AdamW")
    print()

    cpu = estimate(model, batch, optimizer, args.precision, "cpu", **options)
    cuda = estimate(model, batch, optimizer, args.precision, "cuda", **options)
    print(f"batch {batch[0].shape[0]}: peak with the CPU's attention kernels {cpu.peak / GiB:.2f} GiB (activations "
          f"{cpu.activations / GiB:.2f}); cuda, attention kernels modelled: {getattr(cuda, 'attention', None)}: {cuda.peak / GiB:.2f} GiB "
          f"(activations {cuda.activations / GiB:.2f}); difference {(cpu.peak - cuda.peak) / GiB:.2f} GiB")

    calls: list[int] = []
    real = fit_module.estimate

    def counting(*a: Any, **k: Any) -> Any:
        calls.append(a[1][0].shape[0])
        return real(*a, **k)

    fit_module.estimate = counting
    t0 = time.perf_counter()
    found = largest_batch(model, batch, optimizer, args.precision, "cuda", budget=parse_bytes(args.device_memory), **options)
    seconds = time.perf_counter() - t0
    fit_module.estimate = real
    print(f"largest batch in {args.device_memory} on cuda: {found.batch_size} ({len(calls)} estimates, {seconds:.1f} s; "
          f"sizes tried: {calls})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
