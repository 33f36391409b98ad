"""The random stream stochastic rounding draws from: one per run, the same on every replica.

torchao's stochastically rounded optimizers (``bf16-true-sr``) draw their bits from torch's default generator of
the weights' device. Left there, two things go wrong: under DDP each rank's generator is its own (scripts seed by
rank, for dropout and augmentation), so the replicas round the same all-reduced update differently and their
weights drift apart, silently; and the optimizer's draws move the user's stream, so the next step's dropout depends
on how many weights the optimizer rounded. The engine therefore runs each such optimizer step inside
:meth:`RoundingStream.drawing`: ``torch.random.fork_rng`` puts the user's generators back afterwards, and inside it
the device's generator is seeded from ``(run seed, draws so far)``, so that the stream depends on nothing a rank
does on its own:

- **The run seed** is ``torch.initial_seed()`` (what the script last passed to ``torch.manual_seed``) when the first
  rounded step runs, rank 0's under a process group (one broadcast, once): the same seed gives the same run, and
  every replica rounds with rank 0's stream. Seeds differing by rank are the script's own business.
- **Shards** (FSDP2's DTensors) mix in their coordinates on the mesh dimensions that shard them: each rank rounds
  its own shard with bits of its own (the same bits would make row ``i`` of every shard round alike), while the
  replicas of one shard (HSDP's replicate dimension) still share theirs.
- **Draws so far** count the rounded steps taken; a skipped step draws nothing. The seed and the count are the
  engine's state (``Engine.state_dict()["rounding"]``): a checkpoint resumes the rounding bit for bit.

Cost per step: ``fork_rng``'s copy of the CPU generator's state (5 KB) and of the device's, one seeding, no
host-device sync and no per-tensor work.

    >>> opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4))])  # stands in for torchao's rounding optimizer
    >>> stream = RoundingStream(torch.device("cpu"), [opt])
    >>> with torch.random.fork_rng():
    ...     _ = torch.manual_seed(0)
    ...     before = torch.get_rng_state()
    ...     with stream.drawing(opt):
    ...         a = torch.randint(0, 1 << 16, (4,))
    ...     untouched = torch.equal(torch.get_rng_state(), before)
    >>> stream.state_dict(), untouched
    ({'seed': 0, 'draws': 1}, True)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ..distributed._agreement import from_rank0

__all__ = ["RoundingStream", "draws_random_bits", "rounding_stream"]

_MASK = (1 << 64) - 1


def draws_random_bits(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt`` rounds its updates at random (torchao's ``bf16_stochastic_round=True``).

    >>> draws_random_bits(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))]))
    False
    """
    return bool(getattr(opt, "bf16_stochastic_round", False))


def rounding_stream(optimizers: Sequence[torch.optim.Optimizer], device: torch.device) -> RoundingStream | None:
    """The stream the engine's optimizers round with, or None where none rounds at random."""
    rounding = [opt for opt in optimizers if draws_random_bits(opt)]
    return RoundingStream(device, rounding) if rounding else None


def _mix(*words: int) -> int:
    """A 63-bit generator seed from ``words``: splitmix64's finaliser, so that neighbouring seeds or counts give
    unrelated streams (the CPU's mt19937 keeps only a seed's low 32 bits, which must differ too)."""
    x = 0
    for word in words:
        x = (x + 0x9E3779B97F4A7C15 + (word & _MASK)) & _MASK
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
        x ^= x >> 31
    return x >> 1


def _shard_coordinates(optimizers: Sequence[torch.optim.Optimizer]) -> tuple[int, ...]:
    """This rank's coordinates on the mesh dimensions that shard the optimizers' DTensor parameters; () for plain
    tensors or replicas, and where parameters are sharded on different meshes (no one key fits them all: shared)."""
    found = set()
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                mesh, placements = getattr(p, "device_mesh", None), getattr(p, "placements", None)
                if mesh is None or placements is None:
                    found.add(())
                    continue
                found.add(tuple(mesh.get_local_rank(d) for d, place in enumerate(placements) if place.is_shard()))
    return found.pop() if len(found) == 1 else ()


def _seed_device(device: torch.device, seed: int) -> None:
    """Seed the default generator of ``device`` alone (``torch.manual_seed`` would seed every GPU's)."""
    if device.type == "cpu":
        torch.default_generator.manual_seed(seed)
    elif device.type == "cuda":
        torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()].manual_seed(seed)
    else:  # an accelerator with one generator (mps): its module seeds the current device
        torch.get_device_module(device.type).manual_seed(seed)


class RoundingStream:
    """The random stream of one engine's stochastically rounded steps (see the module docstring).

    ``seed`` is None until the first rounded step (or a checkpoint) sets it; ``draws`` counts the rounded steps.
    """

    def __init__(self, device: torch.device, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        self.device = device
        self.seed: int | None = None
        self.draws = 0
        self._optimizers = list(optimizers)
        self._shard: tuple[int, ...] | None = None  # read at the first draw: setup shards the parameters first

    def drawing(self, opt: torch.optim.Optimizer) -> contextlib.AbstractContextManager[None]:
        """The context ``opt``'s step runs in: this stream's next draws if ``opt`` rounds at random, else nothing."""
        return self._draw() if any(opt is o for o in self._optimizers) else contextlib.nullcontext()

    @contextlib.contextmanager
    def _draw(self) -> Iterator[None]:
        """One rounded step's draws: from this stream, the user's generators left as they were."""
        if self.seed is None:
            # Every rank reaches its first optimizer step together (DDP's backward has just all-reduced): one
            # broadcast, once per run.
            self.seed = from_rank0(torch.initial_seed() & (_MASK >> 1))
        if self._shard is None:
            self._shard = _shard_coordinates(self._optimizers)
        key = _mix(self.seed, self.draws, *self._shard)
        self.draws += 1
        devices = [self.device] if self.device.type != "cpu" else []
        with torch.random.fork_rng(devices=devices, device_type=self.device.type):
            _seed_device(self.device, key)
            yield

    def state_dict(self) -> dict[str, Any]:
        """The seed and the draws so far: what a checkpoint keeps to resume the rounding exactly."""
        return {"seed": self.seed, "draws": self.draws}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the stream :meth:`state_dict` describes."""
        self.seed, self.draws = state["seed"], state["draws"]
