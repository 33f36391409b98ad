"""Atomic checkpoint files, safe loading, and RNG state capture (ampkit.fileio._checkpoint_files)."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import ampkit.fileio._checkpoint_files as state_module
from ampkit._errors import CheckpointError
from ampkit.fileio._checkpoint_files import capture_rng_state, load_checkpoint, restore_rng_state, save_checkpoint

# --- helpers -----------------------------------------------------------------------------------------------

# Set by _Booby when unpickling constructs it; a safe loader must never let that happen.
_CONSTRUCTED: list[str] = []


def _construct_booby(tag: str) -> _Booby:
    _CONSTRUCTED.append(f"reduce:{tag}")
    return _Booby(tag)


@dataclass
class _Booby:
    """A custom class that records any attempt to rebuild it from a pickle."""

    tag: str

    def __reduce__(self):
        return (_construct_booby, (self.tag,))

    def __setstate__(self, state):  # pragma: no cover - must never run
        _CONSTRUCTED.append("setstate")
        self.__dict__.update(state)


def _temp_files(directory):
    return sorted(p.name for p in directory.iterdir() if ".tmp" in p.name)


def _failing_save(exc: BaseException):
    """A torch.save stand-in that writes some bytes into the file, then fails like a crash midway."""
    calls = []

    def fake_save(obj, f, *args, **kwargs):
        calls.append(f.name)
        f.write(b"PK\x03\x04 half a checkpoint")
        f.flush()
        raise exc

    return fake_save, calls


def _assert_same(a, b):
    """Deep equality where tensors must match bitwise in dtype, shape and content."""
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        # Compare raw bytes: torch.equal treats NaN != NaN and -0.0 == 0.0, a bitwise round trip must not care.
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


# --- save / load round trip --------------------------------------------------------------------------------


def test_round_trip_preserves_tensors_and_plain_values_exactly(tmp_path):
    generator = torch.Generator().manual_seed(0)
    state = {
        "f32": torch.randn(3, 4, generator=generator),
        "f16": torch.randn(5, generator=generator).half(),
        "bf16": torch.randn(2, 2, generator=generator).bfloat16(),
        "f64_specials": torch.tensor([float("nan"), float("inf"), -0.0, 1e-300], dtype=torch.float64),
        "i64": torch.arange(-5, 5),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "nested": {"optimizer": {"step": 7, "lrs": [0.1, 0.01], "moments": [torch.ones(2), torch.zeros(1)]}},
        "tuple": (1, "two", 3.0),
        "step": 12345,
        "loss": 0.125,
        "name": "run-α",
        "nothing": None,
        "flag": True,
    }
    written = save_checkpoint(state, tmp_path / "ckpt.pt")

    assert written == tmp_path / "ckpt.pt"
    loaded = load_checkpoint(written)
    _assert_same(loaded, state)
    assert _temp_files(tmp_path) == []


def test_file_is_wrapped_in_a_versioned_envelope(tmp_path):
    path = save_checkpoint({"step": 3}, tmp_path / "ckpt.pt")

    raw = torch.load(path, weights_only=True)

    assert raw == {"format": "ampkit-checkpoint", "format_version": 1, "payload": {"step": 3}}


def test_save_accepts_str_path_and_overwrites_previous_checkpoint(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    save_checkpoint({"step": 1}, path)
    save_checkpoint({"step": 2}, path)

    assert load_checkpoint(path) == {"step": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


def test_save_creates_missing_parent_directories(tmp_path):
    path = tmp_path / "runs" / "a" / "b" / "last.pt"

    save_checkpoint({"step": 1}, path)

    assert path.is_file()
    assert load_checkpoint(path) == {"step": 1}


def test_save_writes_through_a_temp_file_beside_the_target(tmp_path, monkeypatch):
    seen = []
    real_save = torch.save

    def spy_save(obj, f, *args, **kwargs):
        seen.append(f.name)
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(state_module.torch, "save", spy_save)
    save_checkpoint({"step": 1}, tmp_path / "ckpt.pt")

    assert len(seen) == 1
    temp = tmp_path / "ckpt.pt"
    assert str(seen[0]).startswith(str(temp)) and ".tmp" in str(seen[0]) and str(seen[0]) != str(temp)
    assert _temp_files(tmp_path) == []


# --- atomicity ---------------------------------------------------------------------------------------------


def test_failed_save_leaves_previous_checkpoint_byte_identical_and_no_temp_file(tmp_path, monkeypatch):
    path = save_checkpoint({"step": 1, "w": torch.arange(4.0)}, tmp_path / "ckpt.pt")
    before = path.read_bytes()
    fake_save, calls = _failing_save(OSError("No space left on device"))
    monkeypatch.setattr(state_module.torch, "save", fake_save)

    with pytest.raises(CheckpointError, match="previous checkpoint .* is untouched") as info:
        save_checkpoint({"step": 2}, path)

    assert len(calls) == 1, "the fake torch.save must have run, or this test proves nothing"
    assert isinstance(info.value.__cause__, OSError)
    assert str(path) in str(info.value)
    assert path.read_bytes() == before
    assert _temp_files(tmp_path) == []
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 1


def test_keyboard_interrupt_midway_reraises_and_leaves_no_temp_file(tmp_path, monkeypatch):
    path = save_checkpoint({"step": 1}, tmp_path / "ckpt.pt")
    before = path.read_bytes()
    fake_save, calls = _failing_save(KeyboardInterrupt())
    monkeypatch.setattr(state_module.torch, "save", fake_save)

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint({"step": 2}, path)

    assert len(calls) == 1
    assert path.read_bytes() == before
    assert _temp_files(tmp_path) == []


def test_failed_first_save_leaves_nothing_behind(tmp_path, monkeypatch):
    fake_save, _ = _failing_save(RuntimeError("boom"))
    monkeypatch.setattr(state_module.torch, "save", fake_save)

    with pytest.raises(CheckpointError, match="boom"):
        save_checkpoint({"step": 1}, tmp_path / "ckpt.pt")

    assert list(tmp_path.iterdir()) == []


def test_save_to_a_directory_is_rejected_with_the_fix(tmp_path):
    with pytest.raises(CheckpointError, match="is a directory; pass a file path such as") as info:
        save_checkpoint({"step": 1}, tmp_path)

    assert str(tmp_path / "checkpoint.pt") in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_save_rejects_a_non_dict_state(tmp_path):
    with pytest.raises(TypeError, match="expects a dict"):
        save_checkpoint([1, 2], tmp_path / "ckpt.pt")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


# --- load errors -------------------------------------------------------------------------------------------


def test_truncated_checkpoint_is_reported_as_corrupt(tmp_path):
    path = save_checkpoint({"w": torch.randn(64, 64)}, tmp_path / "ckpt.pt")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])

    with pytest.raises(CheckpointError, match="truncated or corrupt") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b.__setitem__(slice(4, 64), b"\0" * 60), id="local-header"),
        pytest.param(lambda b: b.__setitem__(slice(100, 200), b"\xff" * 100), id="pickle-bytes"),
        pytest.param(lambda b: b.__setitem__(slice(-200, -100), b"\xff" * 100), id="central-directory"),
        pytest.param(lambda b: b.__setitem__(slice(0, 4), b"\0" * 4), id="zip-magic"),
    ],
)
def test_checkpoint_with_damaged_bytes_is_reported_as_corrupt(tmp_path, damage):
    path = save_checkpoint({"w": torch.randn(64, 64)}, tmp_path / "ckpt.pt")
    data = bytearray(path.read_bytes())
    damage(data)
    path.write_bytes(bytes(data))

    with pytest.raises(CheckpointError, match="truncated or corrupt") as info:
        load_checkpoint(path)
    # torch's own text suggests weights_only=False; ampkit must never pass that advice on.
    assert "weights_only" not in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("content", [b"this is not a checkpoint at all" * 4, b""], ids=["garbage", "empty"])
def test_garbage_file_is_reported_as_corrupt(tmp_path, content):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(content)

    with pytest.raises(CheckpointError, match="truncated or corrupt") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


def test_file_with_custom_objects_is_refused_and_never_constructed(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": "ampkit-checkpoint", "format_version": 1, "payload": {"x": _Booby("boom")}}, path)
    _CONSTRUCTED.clear()

    refused = r"arbitrary Python objects \(such as .*\) and was refused for safety"
    with pytest.raises(CheckpointError, match=refused) as info:
        load_checkpoint(path)

    message = str(info.value)
    assert str(path) in message
    assert "only tensors and plain containers" in message
    assert "_construct_booby" in message  # names the offending global
    assert _CONSTRUCTED == []


def test_plain_torch_file_without_marker_is_not_an_ampkit_checkpoint(tmp_path):
    path = tmp_path / "plain.pt"
    torch.save({"step": 1, "w": torch.ones(2)}, path)

    with pytest.raises(CheckpointError, match="not an ampkit checkpoint") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


def test_plain_torch_tensor_file_is_not_an_ampkit_checkpoint(tmp_path):
    path = tmp_path / "tensor.pt"
    torch.save(torch.ones(2), path)

    with pytest.raises(CheckpointError, match="not an ampkit checkpoint"):
        load_checkpoint(path)


def test_newer_format_version_asks_to_upgrade(tmp_path):
    path = tmp_path / "future.pt"
    torch.save({"format": "ampkit-checkpoint", "format_version": 2, "payload": {}}, path)

    with pytest.raises(CheckpointError, match="format_version 2, newer than the 1 .* upgrade ampkit"):
        load_checkpoint(path)


def test_missing_file_is_reported(tmp_path):
    path = tmp_path / "nope.pt"

    with pytest.raises(CheckpointError, match="does not exist") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


def test_loading_a_directory_is_reported(tmp_path):
    with pytest.raises(CheckpointError, match="is a directory"):
        load_checkpoint(tmp_path)


def test_load_always_uses_weights_only(tmp_path, monkeypatch):
    path = save_checkpoint({"step": 1}, tmp_path / "ckpt.pt")
    seen = []
    real_load = torch.load

    def spy_load(*args, **kwargs):
        seen.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(state_module.torch, "load", spy_load)
    assert load_checkpoint(path, map_location=None) == {"step": 1}
    assert seen == [True]


# --- RNG state ---------------------------------------------------------------------------------------------


def _draws(device=torch.device("cpu")):
    return (
        torch.rand(8),
        torch.randint(0, 1000, (4,)),
        [random.random() for _ in range(4)] + [random.gauss(0.0, 1.0)],
        np.random.rand(4),
        np.random.standard_normal(3),
        torch.rand(8, device=device),  # on CUDA: that device's own generator (Dropout's masks come from it)
    )


def _assert_same_draws(a, b):
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert a[2] == b[2]
    np.testing.assert_array_equal(a[3], b[3])
    np.testing.assert_array_equal(a[4], b[4])
    assert torch.equal(a[5], b[5])


@pytest.fixture
def seeded_rngs():
    """Seed all the generators and restore whatever state the test session had before."""
    saved = (torch.get_rng_state(), random.getstate(), np.random.get_state())
    cuda_saved = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)
    # A pending cached Gaussian in Python and NumPy exercises the less obvious parts of the state.
    random.gauss(0.0, 1.0)
    np.random.standard_normal()
    yield
    torch.set_rng_state(saved[0])
    random.setstate(saved[1])
    np.random.set_state(saved[2])
    if cuda_saved is not None:
        torch.cuda.set_rng_state_all(cuda_saved)


def test_restore_repeats_the_next_draws_of_every_generator(seeded_rngs, device):
    snapshot = capture_rng_state()
    first = _draws(device)
    second = _draws(device)
    restore_rng_state(snapshot)
    again = _draws(device)

    _assert_same_draws(first, again)
    # Guard against a vacuous pass: without restoring, the draws move on.
    assert not torch.equal(first[0], second[0]) and not torch.equal(first[5], second[5])
    assert first[2] != second[2]
    assert not np.array_equal(first[3], second[3])


def test_snapshot_holds_only_weights_only_loadable_types(seeded_rngs):
    snapshot = capture_rng_state()

    assert set(snapshot) >= {"torch", "python", "numpy"}
    assert ("cuda" in snapshot) == torch.cuda.is_available()
    assert isinstance(snapshot["python"], list) and isinstance(snapshot["python"][1], list)
    assert isinstance(snapshot["numpy"]["keys"], torch.Tensor)


def test_rng_snapshot_round_trips_through_a_checkpoint(tmp_path, seeded_rngs, device):
    snapshot = capture_rng_state()
    first = _draws(device)
    path = save_checkpoint({"rng": snapshot, "step": 5}, tmp_path / "ckpt.pt")
    _draws(device)  # move every generator on

    loaded = load_checkpoint(path)
    restore_rng_state(loaded["rng"])

    _assert_same_draws(first, _draws(device))


def test_cuda_state_without_cuda_restores_the_rest_and_warns(seeded_rngs, monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    snapshot = capture_rng_state()
    snapshot["cuda"] = [torch.zeros(16, dtype=torch.uint8)]
    first = _draws()

    with caplog.at_level(logging.WARNING, logger="ampkit"):
        restore_rng_state(snapshot)
    again = _draws()

    _assert_same_draws(first, again)
    records = [r for r in caplog.records if r.name == "ampkit"]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    assert "CUDA is not available" in records[0].getMessage()


def test_restore_rejects_something_that_is_not_a_snapshot():
    with pytest.raises(CheckpointError, match="not an RNG snapshot"):
        restore_rng_state({"step": 1})


def test_write_text_atomic_replaces_whole_and_respects_the_umask(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os

    from ampkit.fileio._checkpoint_files import write_text_atomic

    target = tmp_path / "report.md"
    target.write_text("old")
    old_mask = os.umask(0o022)
    try:
        write_text_atomic(target, "new\n")
    finally:
        os.umask(old_mask)
    assert target.read_text() == "new\n"
    assert target.stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600: readable like any file the user writes
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]  # no temporary left behind


# --- checkpoints written on a GPU --------------------------------------------------------------------------


def _save_as_on_cuda(state, path, monkeypatch):
    """Write ``state`` as a GPU machine would: torch.save tags every storage with the device it lived on, and a
    CUDA machine's file says "cuda:0" where this one's says "cpu" (the bytes are the same once copied to host)."""
    with monkeypatch.context() as patch:
        patch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        save_checkpoint(state, path)
    with pytest.raises(RuntimeError, match="CUDA"):  # the file really is tagged for CUDA
        torch.load(path, weights_only=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_a_gpu_checkpoint_loads_on_a_machine_without_cuda(tmp_path, monkeypatch):
    path = tmp_path / "gpu.pt"
    _save_as_on_cuda({"weight": torch.arange(4.0), "step": 3}, path, monkeypatch)
    loaded = load_checkpoint(path)  # map_location="cpu" by default
    assert loaded["step"] == 3 and torch.equal(loaded["weight"], torch.arange(4.0)) and loaded["weight"].device.type == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_a_gpu_checkpoint_kept_on_cuda_names_map_location_not_corruption(tmp_path, monkeypatch):
    path = tmp_path / "gpu.pt"
    _save_as_on_cuda({"weight": torch.arange(4.0)}, path, monkeypatch)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path, map_location=None)
    message = str(info.value)
    assert "map_location='cpu'" in message and "device this machine lacks" in message
    assert "corrupt" not in message
