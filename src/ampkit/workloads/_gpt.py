"""``gpt``: a GPT-style byte-level language model trained on the Python standard library's own sources.

Every CPython installation ships its standard library as ``.py`` files, so the text is on every machine and
nothing is downloaded. A fixed, sorted list of modules present in every CPython 3.10+ is concatenated (files a
particular installation lacks are skipped) up to a size-dependent number of bytes, then split 90/10 into
training and eval text. Bytes are the tokens (vocabulary 256): no tokenizer to ship or to disagree about.

    >>> w = build("tiny", seed=0)
    >>> x, y = w.batch(0)
    >>> tuple(x.shape), x.dtype, bool((x[:, 1:] == y[:, :-1]).all())  # targets: the inputs shifted by one
    ((4, 32), torch.int64, True)
"""

from __future__ import annotations

import functools
import math
import os
import sysconfig
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.nn import functional as F

from ._metrics import LanguageModelMetrics
from ._workload import SIZES, Batch, Workload, default_optimizer

__all__ = ["CORPUS_FILES", "GPT", "VOCAB", "build", "lm_cross_entropy", "stdlib_corpus"]

VOCAB = 256  # byte-level

CORPUS_FILES = (
    "_pydecimal.py", "abc.py", "argparse.py", "ast.py", "asyncio/base_events.py", "asyncio/tasks.py",
    "base64.py", "bdb.py", "bisect.py", "calendar.py", "cmd.py", "code.py", "codecs.py", "collections/__init__.py",
    "colorsys.py", "concurrent/futures/_base.py", "configparser.py", "contextlib.py", "contextvars.py", "copy.py",
    "copyreg.py", "csv.py", "dataclasses.py", "datetime.py", "difflib.py", "dis.py", "doctest.py",
    "email/_header_value_parser.py", "email/message.py", "enum.py", "filecmp.py", "fileinput.py", "fnmatch.py",
    "fractions.py", "ftplib.py", "functools.py", "genericpath.py", "getopt.py", "getpass.py", "gettext.py",
    "glob.py", "graphlib.py", "gzip.py", "hashlib.py", "heapq.py", "hmac.py", "http/client.py",
    "http/cookiejar.py", "http/server.py", "imaplib.py", "inspect.py", "ipaddress.py", "json/decoder.py",
    "json/encoder.py", "keyword.py", "linecache.py", "locale.py", "logging/__init__.py", "logging/handlers.py",
    "mailbox.py", "mimetypes.py", "multiprocessing/pool.py", "netrc.py", "ntpath.py", "numbers.py", "opcode.py",
    "operator.py", "optparse.py", "os.py", "pdb.py", "pickle.py", "pickletools.py", "platform.py", "plistlib.py",
    "poplib.py", "posixpath.py", "pprint.py", "pstats.py", "py_compile.py", "pydoc.py", "queue.py", "quopri.py",
    "random.py", "reprlib.py", "rlcompleter.py", "runpy.py", "sched.py", "secrets.py", "selectors.py",
    "shelve.py", "shlex.py", "shutil.py", "signal.py", "site.py", "smtplib.py", "socket.py", "socketserver.py",
    "sqlite3/__init__.py", "ssl.py", "stat.py", "statistics.py", "string.py", "stringprep.py", "struct.py",
    "subprocess.py", "symtable.py", "sysconfig.py", "tabnanny.py", "tarfile.py", "tempfile.py", "textwrap.py",
    "threading.py", "timeit.py", "token.py", "tokenize.py", "trace.py", "traceback.py", "tracemalloc.py",
    "turtle.py", "types.py", "typing.py", "unittest/case.py", "unittest/mock.py", "urllib/parse.py",
    "urllib/request.py", "uuid.py", "warnings.py", "wave.py", "weakref.py", "webbrowser.py",
    "xml/dom/minidom.py", "zipapp.py", "zipimport.py",
)
"""Standard-library sources (relative to ``sysconfig.get_paths()["stdlib"]``) present in CPython 3.10 to 3.13;
modules that became packages (pathlib, zipfile) or were removed (asyncore, imp, cgi...) are left out."""


@dataclass(frozen=True)
class _Config:
    layers: int
    d_model: int
    heads: int
    seq_len: int
    batch: int
    steps: int
    warmup: int
    lr: float
    corpus_bytes: int  # text read from the standard library (90% training, 10% eval)
    eval_windows: int  # fixed, non-overlapping eval windows of seq_len tokens (fewer if the eval text is short)


# small: d_model 256 so the matmuls are big enough for bf16 to pay on a CPU; 200 steps of 1,024 tokens. The
# learning rates are modest because there is no warm-up: at 1e-3 the eval perplexity of the small run still swings
# by 2-3% from one checkpoint to the next, which would drown the fp32/bf16 comparison; 6e-4 learns faster and
# settles within 0.5%.
_CONFIGS = {
    "tiny": _Config(layers=1, d_model=32, heads=2, seq_len=32, batch=4, steps=6, warmup=2, lr=3e-3,
                    corpus_bytes=40_000, eval_windows=8),
    "small": _Config(layers=2, d_model=256, heads=4, seq_len=64, batch=16, steps=200, warmup=3, lr=6e-4,
                     corpus_bytes=1_000_000, eval_windows=512),
    # large, the GPU default: GPT-2 small's transformer (12 layers, d_model 768, 12 heads, 1024-token context) at 8 x
    # 1024 tokens a step, the shape GPU users train. The byte vocabulary (256, not GPT-2's 50,257 BPE tokens) leaves
    # out GPT-2's 38.6 M-parameter embedding and its 50,257-wide head: 86 M parameters instead of 124 M, the same
    # matmuls in every block. The first GPU run's large (6 layers, 256 tokens of context, 43 M parameters) stepped in
    # 15 ms under bf16-mixed on an H200 with a 30% step-to-step spread: it measured kernel launches more than
    # precision. 150 steps keep the 11 default policies within the GPU suite's bench budget (about 90 s on an H200).
    "large": _Config(layers=12, d_model=768, heads=12, seq_len=1024, batch=8, steps=150, warmup=5, lr=3e-4,
                     corpus_bytes=6_000_000, eval_windows=256),
}


# ---------------------------------------------------------------------------------------------- the model


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through :func:`torch.nn.functional.scaled_dot_product_attention`, which
    picks the fused (flash / memory-efficient) kernel the device and dtype allow."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model={d_model} must be a multiple of heads={heads}.")
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))`` with a 4x GELU MLP."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + learned position embeddings, ``layers`` pre-LN blocks, a final LayerNorm and an output head tied
    to the token embedding: ``(B, T)`` int64 tokens -> ``(B, T, vocab)`` logits, ``T <= seq_len``.

    >>> GPT(vocab=256, seq_len=8, d_model=16, heads=2, layers=1)(torch.zeros(2, 8, dtype=torch.long)).shape
    torch.Size([2, 8, 256])
    """

    def __init__(self, vocab: int = VOCAB, seq_len: int = 128, d_model: int = 256, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.seq_len = seq_len
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied: one matrix reads and writes tokens
        # GPT-2 initialisation: N(0, 0.02), the projections into the residual stream scaled down by
        # sqrt(2 * layers) so the stream's variance does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("attn.proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.seq_len:
            raise ValueError(f"sequence of {t} tokens is longer than the model's seq_len={self.seq_len}.")
        x = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def lm_cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy: logits ``(B, T, V)`` flattened to ``(B*T, V)`` against targets ``(B, T)``.

    >>> loss = lm_cross_entropy(torch.zeros(2, 3, 256), torch.zeros(2, 3, dtype=torch.long))  # uniform logits
    >>> math.isclose(loss.item(), math.log(256), rel_tol=1e-6)
    True
    """
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


# ----------------------------------------------------------------------------------------------- the data


@functools.lru_cache(maxsize=4)
def stdlib_corpus(max_bytes: int) -> tuple[bytes, int]:
    """Up to ``max_bytes`` of the :data:`CORPUS_FILES` found in this Python's standard library, concatenated in
    list order, and how many files went in. Raises FileNotFoundError when none is there (a Python installed
    without its ``.py`` sources).

    >>> text, files = stdlib_corpus(1000)
    >>> len(text), files
    (1000, 1)
    """
    root = sysconfig.get_paths()["stdlib"]
    parts: list[bytes] = []
    size = 0
    for rel in CORPUS_FILES:
        if size >= max_bytes:
            break
        try:
            with open(os.path.join(root, *rel.split("/")), "rb") as f:
                data = f.read(max_bytes - size)
        except OSError:
            continue  # an installation without this module (or with it stripped): use the others
        parts.append(data)
        size += len(data)
    if not parts:
        raise FileNotFoundError(
            f"gpt workload: none of the {len(CORPUS_FILES)} standard-library sources it trains on was found under "
            f"{root!r}; this Python seems to be installed without its .py files (install the full standard library)."
        )
    return b"".join(parts), len(parts)


def _windows(data: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    """``data[s : s + length]`` for every start, as one int64 tensor ``(*starts.shape, length)``."""
    return data[starts.unsqueeze(-1) + torch.arange(length)].long()


def build(size: str = "small", seed: int = 0, batch_size: int | None = None) -> Workload:
    """The gpt workload at ``size`` (``tiny``, ``small``, ``large``); same seed, same weights and batches.
    ``batch_size`` replaces the size's batch (rows per training batch).

    Training windows of ``seq_len + 1`` bytes start at random offsets of the training text (drawn with a
    generator seeded by ``seed``); the eval windows are fixed: consecutive, non-overlapping, from the eval text.

    >>> w = build("tiny")
    >>> w.unit, w.items_per_batch, w.metric().name, w.extra["vocab"]
    ('tokens', 128, 'perplexity', 256)
    """
    if size not in _CONFIGS:
        raise ValueError(f"unknown size {size!r} for workload 'gpt'; choose one of {', '.join(SIZES)}.")
    cfg = _CONFIGS[size] if batch_size is None else replace(_CONFIGS[size], batch=batch_size)  # --batch-size
    t = cfg.seq_len
    text, files = stdlib_corpus(cfg.corpus_bytes)
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    cut = int(0.9 * len(data))
    train, held_out = data[:cut], data[cut:]
    if len(train) <= t + 1 or len(held_out) <= t + 1:
        raise ValueError(f"gpt workload: {len(data)} bytes of text are too few for seq_len={t}.")

    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(train) - t, (cfg.steps, cfg.batch), generator=generator)
    train_windows = _windows(train, starts, t + 1)  # (steps, B, T + 1)
    batches: list[Batch] = [(w[:, :-1], w[:, 1:]) for w in train_windows]

    n_eval = min(cfg.eval_windows, (len(held_out) - 1) // t)
    eval_windows = _windows(held_out, torch.arange(n_eval) * t, t + 1)  # (n_eval, T + 1), independent of seed
    eval_batches: list[Batch] = [(w[:, :-1], w[:, 1:]) for w in eval_windows.split(cfg.batch)]

    # fork_rng(devices=[]): only the CPU generator is forked and seeded (the model is built on the CPU), so
    # the caller's CPU and CUDA RNG states are left exactly as they were.
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        model = GPT(VOCAB, t, cfg.d_model, cfg.heads, cfg.layers)
    params = sum(p.numel() for p in model.parameters())  # the tied head counts once
    return Workload(
        name="gpt",
        model=model,
        train_batches=batches,
        eval_batches=eval_batches,
        metric=LanguageModelMetrics,
        loss_fn=lm_cross_entropy,
        optimizer=functools.partial(default_optimizer, lr=cfg.lr),
        items_per_batch=cfg.batch * t,
        unit="tokens",
        steps=cfg.steps,
        warmup=cfg.warmup,
        description=(
            f"GPT ({cfg.layers} layers, d_model {cfg.d_model}, {cfg.heads} heads, {params / 1e6:.2f}M params), "
            f"byte-level on {len(data) / 1e6:.2f} MB of Python stdlib source, batch {cfg.batch} x {t} tokens"
        ),
        extra={"parameters": params, "layers": cfg.layers, "d_model": cfg.d_model, "heads": cfg.heads,
               "seq_len": t, "batch_size": cfg.batch, "vocab": VOCAB, "corpus_bytes": len(data),
               "corpus_files": files, "eval_tokens": n_eval * t},
    )
