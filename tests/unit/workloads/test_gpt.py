"""The gpt workload: byte-level text from the standard library and a small causal transformer.

The contract shared by every workload (determinism, RNG, a tiny run that learns) is in test_registry.py.
"""

from __future__ import annotations

import copy
import math
import sysconfig

import pytest
import torch
from torch.nn import functional as F

from ampkit.workloads import _gpt as gpt
from ampkit.workloads._metrics import LanguageModelMetrics


@pytest.fixture(scope="module")
def tiny():
    return gpt.build("tiny", seed=0)


@pytest.fixture
def fresh_corpus_cache():
    gpt.stdlib_corpus.cache_clear()  # the corpus is cached per size; these tests point it elsewhere
    yield
    gpt.stdlib_corpus.cache_clear()


def test_batches_are_shifted_byte_windows(tiny) -> None:
    cfg = gpt._CONFIGS["tiny"]
    for x, y in list(tiny.train_batches) + list(tiny.eval_batches):
        assert x.dtype == torch.int64 and y.dtype == torch.int64 and x.shape == y.shape
        assert x.shape[1] == cfg.seq_len and 0 <= int(x.min()) and int(x.max()) < 256
        assert torch.equal(x[:, 1:], y[:, :-1])
    assert len(tiny.train_batches) == tiny.steps
    assert tiny.items_per_batch == cfg.batch * cfg.seq_len and tiny.unit == "tokens"


def test_windows_come_from_the_stdlib_text(tiny) -> None:
    text, _ = gpt.stdlib_corpus(gpt._CONFIGS["tiny"].corpus_bytes)
    x, y = tiny.batch(0)
    window = bytes(x[0].tolist()) + bytes(y[0, -1:].tolist())
    assert window in text[: int(0.9 * len(text))]  # a training window lies in the training 90%


def test_eval_windows_are_fixed_and_consecutive(tiny) -> None:
    other = gpt.build("tiny", seed=3)
    xs = torch.cat([x for x, _ in tiny.eval_batches])
    assert torch.equal(xs, torch.cat([x for x, _ in other.eval_batches]))
    ys = torch.cat([y for _, y in tiny.eval_batches])
    assert torch.equal(ys[:-1, -1], xs[1:, 0])  # each window starts where the previous one's targets end
    text, _ = gpt.stdlib_corpus(gpt._CONFIGS["tiny"].corpus_bytes)
    held_out = text[int(0.9 * len(text)) :]
    assert bytes(xs[0].tolist()) == held_out[: xs.shape[1]]


def test_model_is_causal_and_tied(tiny) -> None:
    model = copy.deepcopy(tiny.model).eval()
    x, _ = tiny.batch(0)
    changed = x.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 256
    with torch.no_grad():
        a, b = model(x), model(changed)
    assert a.shape == (*x.shape, 256)
    assert torch.allclose(a[:, :-1], b[:, :-1], atol=1e-6)  # a later token changes nothing before it
    assert not torch.allclose(a[:, -1], b[:, -1])
    assert model.head.weight is model.tok.weight
    clone = copy.deepcopy(model)
    assert clone.head.weight is clone.tok.weight  # each policy's deep copy stays tied


def test_model_rejects_too_long_sequences() -> None:
    model = gpt.GPT(seq_len=4, d_model=8, heads=2, layers=1)
    with pytest.raises(ValueError, match="longer than the model's seq_len=4"):
        model(torch.zeros(1, 5, dtype=torch.long))


def test_loss_and_metric(tiny) -> None:
    logits = torch.randn(2, 5, 256)
    target = torch.randint(0, 256, (2, 5))
    assert tiny.loss_fn is gpt.lm_cross_entropy
    assert gpt.lm_cross_entropy(logits, target).item() == pytest.approx(F.cross_entropy(logits.view(10, 256), target.view(10)).item())
    assert tiny.metric is LanguageModelMetrics
    assert tiny.model(tiny.batch(0)[0]).shape[-1] == 256


@pytest.mark.parametrize("size", ["tiny", "small", "large"])
def test_model_output_per_size(size: str) -> None:
    cfg = gpt._CONFIGS[size]
    assert cfg.d_model % cfg.heads == 0 and cfg.steps > cfg.warmup
    with torch.device("meta"):  # shapes only: the large model is never materialised here
        model = gpt.GPT(gpt.VOCAB, cfg.seq_len, cfg.d_model, cfg.heads, cfg.layers)
        out = model(torch.zeros(2, cfg.seq_len, dtype=torch.long))
    assert out.shape == (2, cfg.seq_len, gpt.VOCAB)


def test_small_settings() -> None:
    w = gpt.build("small", seed=0)
    assert w.extra["d_model"] >= 256 and w.extra["seq_len"] == 64 and w.extra["vocab"] == 256
    assert w.extra["parameters"] == sum(p.numel() for p in w.model.parameters())
    assert w.extra["corpus_bytes"] > 500_000 and w.extra["eval_tokens"] > 10_000


def test_corpus_skips_missing_files(tmp_path, monkeypatch, fresh_corpus_cache) -> None:
    (tmp_path / "argparse.py").write_bytes(b"import sys\n" * 10)
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "decoder.py").write_bytes(b"x = 1\n" * 10)
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    text, files = gpt.stdlib_corpus(1_000)
    assert files == 2 and text == b"import sys\n" * 10 + b"x = 1\n" * 10  # list order
    text, files = gpt.stdlib_corpus(15)
    assert (text, files) == (b"import sys\nimpo", 1)  # cut at the byte limit


def test_corpus_missing_altogether(tmp_path, monkeypatch, fresh_corpus_cache) -> None:
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    with pytest.raises(FileNotFoundError, match="none of the .* standard-library sources"):
        gpt.stdlib_corpus(1_000)


def test_too_little_text_is_a_clear_error(tmp_path, monkeypatch, fresh_corpus_cache) -> None:
    (tmp_path / "os.py").write_bytes(b"pass\n" * 5)
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    with pytest.raises(ValueError, match="too few for seq_len"):
        gpt.build("tiny")


def test_initial_loss_is_near_uniform(tiny) -> None:
    # GPT-2 initialisation: the untrained model's loss is close to log(256), not a confident wrong guess
    x, y = tiny.batch(0)
    with torch.no_grad():
        loss = gpt.lm_cross_entropy(tiny.model(x), y).item()
    assert abs(loss - math.log(256)) < 0.1
