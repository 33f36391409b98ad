"""Train a Hugging Face GPT-2-style model with ampkit's Engine (bf16-mixed on the CPU), save it and load it back.

The model is random-initialised from a small ``GPT2Config`` and the data is synthetic, so nothing is
downloaded. Batches are what a Hugging Face collator returns, ``{"input_ids", "attention_mask", "labels"}``,
passed as ``model(**batch)``; the model computes its own loss (``output.loss``) from the labels.

    python examples/train_hf_gpt2.py                          # 60 steps of bf16-mixed, then save and load
    python examples/train_hf_gpt2.py --precision 32-true --steps 20 --checkpoint runs/gpt2.pt

The module-level factories ``model()`` and ``data()`` make the same model a subject for every ampkit tool:

    ampkit bench --model examples/train_hf_gpt2.py:model --data examples/train_hf_gpt2.py:data --steps 30
    ampkit memory --model examples/train_hf_gpt2.py:model --data examples/train_hf_gpt2.py:data
    ampkit doctor --model examples/train_hf_gpt2.py:model --data examples/train_hf_gpt2.py:data

Requires transformers: ``pip install ampkit[hf]``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

import ampkit
from ampkit.bench import BenchData

try:
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError as exc:  # an optional extra: say how to get it rather than fail deep in an import
    raise SystemExit(f"this example needs transformers ({exc}); install it with: pip install ampkit[hf]") from None

VOCAB, SEQ, BATCH = 128, 32, 8


def model(n_layer: int = 2, n_embd: int = 64, seed: int = 0) -> GPT2LMHeadModel:
    """A small random-initialised GPT-2 (about 0.1M weights at the defaults), in fp32."""
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_layer=n_layer, n_embd=n_embd, n_head=2,
        bos_token_id=0, eos_token_id=0,  # inside the vocabulary (GPT-2's own 50256 is not)
        use_cache=False,  # training: no key/value cache to return
    )
    torch.manual_seed(seed)
    net = GPT2LMHeadModel(config)
    net.loss_type = "ForCausalLM"  # transformers cannot infer it from the class name and warns otherwise
    return net


def batches(count: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``count`` deterministic batches of counting sequences (each token the previous plus a per-row stride):
    a pattern a tiny model learns within a few dozen steps. Rows end in padding that the labels ignore (-100)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        start = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
        stride = torch.randint(1, 4, (BATCH, 1), generator=g)
        input_ids = (start + stride * torch.arange(SEQ)) % VOCAB  # (B, T)
        lengths = torch.randint(SEQ // 2, SEQ + 1, (BATCH, 1), generator=g)
        attention_mask = (torch.arange(SEQ) < lengths).long()  # (B, T): 1 for real tokens, 0 for padding
        labels = input_ids.masked_fill(attention_mask == 0, -100)  # the model shifts them by one itself
        out.append({"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels})
    return out


def data() -> BenchData:
    """What ``--data`` takes: training and held-out batches; the model's own loss is the loss and the eval metric."""
    return BenchData(train=batches(64, seed=0), eval=batches(4, seed=1))


@torch.no_grad()
def eval_loss(net: torch.nn.Module, engine: ampkit.Engine, held_out: list[dict[str, torch.Tensor]]) -> float:
    net.eval()
    with engine.autocast():
        total = sum(net(**b).loss.float() for b in held_out)
    net.train()
    return float(total) / len(held_out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="bf16-mixed", help="policy or alias (default: bf16-mixed)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--checkpoint", type=Path, help="where to save (default: a temporary file)")
    args = parser.parse_args()
    try:
        precision = ampkit.get_policy(args.precision).name
    except ampkit.PolicyError as e:
        parser.error(str(e))
    train, held_out = batches(args.steps), batches(4, seed=1)

    net = model()
    engine = ampkit.Engine(precision, clip_grad_norm=1.0)
    net, optimizer = engine.setup(net, torch.optim.AdamW(net.parameters(), lr=args.lr))
    print(f"[{precision}] eval loss before training {eval_loss(net, engine, held_out):.4f}")
    for step, batch in enumerate(train, 1):
        with engine.autocast():
            loss = net(**batch).loss  # (B, T) logits -> mean next-token cross-entropy over unpadded tokens
        engine.backward(loss)
        engine.step()
        if step % 20 == 0 or step == len(train):
            print(f"[{precision}] step {step}/{len(train)}  loss {loss.item():.4f}")
    trained = eval_loss(net, engine, held_out)
    print(f"[{precision}] eval loss after training {trained:.4f}")

    with tempfile.TemporaryDirectory() as tmp:
        path = args.checkpoint or Path(tmp) / "gpt2.pt"
        engine.save(path, extra={"step": len(train)})  # weights, optimizer, scaler and RNG, atomically
        fresh = model(seed=1)  # other weights: the load must replace them all
        engine2 = ampkit.Engine(precision, clip_grad_norm=1.0)
        fresh, _ = engine2.setup(fresh, torch.optim.AdamW(fresh.parameters(), lr=args.lr))
        extra = engine2.load(path)
        reloaded = eval_loss(fresh, engine2, held_out)
    same = "the same" if reloaded == trained else "DIFFERENT"
    print(f"[{precision}] reloaded step {extra['step']}: eval loss {reloaded:.4f}, {same} as before saving")


if __name__ == "__main__":
    main()
