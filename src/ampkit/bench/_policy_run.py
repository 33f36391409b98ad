"""One policy's training run inside a bench: build, measure alone, train in chunks, evaluate, summarise.

The runner drives several of these side by side. Each run owns its RNG state (dropout masks, fused-kernel
randomness), swapped in around its own chunks, so interleaving runs does not change what any of them computes:
a run trained in chunks between other runs matches the same run trained alone, step for step.

Under torchrun (``rank``/``world`` > 1) the engine wraps the model in DDP and each rank trains its slice of every
batch. The figures are combined once, in :meth:`PolicyRun.summarize` (:mod:`~ampkit.bench._run_summary`): one
``all_gather_object`` of each rank's losses, step times and memory, so no step waits on the host for another rank
beyond DDP's own all-reduce.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from .._compat import graphs_compiled, tree_map
from .._errors import one_line
from ..distributed._strategy import unwrap
from ..memory._workspaces import create_library_workspaces
from ..policy import Policy
from ..training._engine import Engine
from ..workloads._recipe import with_lr
from ..workloads._timing import StepTimer
from ..workloads._workload import Batch, Workload
from ._flops import count_flops
from ._memory import (
    SavedActivations,
    StepPeak,
    peak_rss_bytes,
    reset_peak_rss,
    training_state_bytes,
)
from ._model_io import batch_loss, run_batch
from ._results import RunResult
from ._run_summary import summarize_run

__all__ = ["PolicyRun", "compile_phase"]

log = logging.getLogger("ampkit")


def compile_phase(engine: Engine) -> str | None:
    """What ``engine`` compiles in its first steps, as a progress phase: the model (``compile=``), its optimizer step
    (one compiled region: ``bf16-true-sr``'s library step, or a master-weight step under ``compile=``), both, or None.

    >>> import ampkit
    >>> engine = ampkit.Engine("32-true", compile={"backend": "eager"})
    >>> _ = engine.setup(nn.Linear(2, 2))
    >>> compile_phase(engine), compile_phase(ampkit.Engine("32-true"))
    ('compiling the model', None)
    """
    parts = ["the model"] if engine.compiled else []
    if engine.fused_step is not None or engine.library_step is not None:
        parts.append("the optimizer step")
    return "compiling " + " and ".join(parts) if parts else None


class PolicyRun:
    """Trains ``workload`` under ``policy`` on ``device``; its figures accumulate in :attr:`result`, under the
    policy's name.

    ``compile``: what ``Engine(compile=...)`` gets (None: eager); ``mode`` names it in the result (see
    :func:`ampkit.bench._recipe.compile_mode`). ``engine_options``: more keyword arguments for the Engine (``ampkit
    tune`` tries ``fused_step=True``); ``prepare(model)``: called on each fresh copy of the initial weights before
    the Engine sets it up (``ampkit tune`` checkpoints its blocks there with :func:`ampkit.memory.recompute`). A compiled run compiles in its first steps, which are the first
    of :meth:`measure_alone`: their time, less as many steady steps, is its compile time, kept out of the timed
    steps. The timed build is another engine, which compiles again (each engine keeps its own compiled code; the
    compiler's on-disk cache makes it quicker) during its untimed warm-up, so the timed steps are steady.
    """

    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        device: torch.device,
        batches: Sequence[Batch],
        seed: int,
        *,
        strategy: str | None = None,
        rank: int = 0,
        world: int = 1,
        compile: Any = None,
        mode: str | None = None,
        engine_options: dict[str, Any] | None = None,
        prepare: Callable[[nn.Module], Any] | None = None,
    ) -> None:
        self.workload = workload
        self.compile = compile
        self.engine_options = dict(engine_options or {})
        self.prepare = prepare
        self.strategy = strategy
        self.rank, self.world = rank, world
        self.precision = policy.name
        self.policy = policy
        """What the engine gets, as given; an fp8 policy's run gets the policy set to its layer plan instead."""
        self.device = device
        self.batches = batches
        self.seed = seed
        self.result = RunResult(precision=policy.name, throughput_unit=workload.unit, compile=mode)
        self.label = self.result.label
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.engine: Engine | None = None
        self.steps_done = 0
        self.losses: list[torch.Tensor] = []
        self.times: list[float] = []
        self.compiled: list[bool] = []  # per timed step, parallel to times: whether torch.compile compiled during it
        self.timer = StepTimer(device)
        self.first_steps: list[float] = []  # a compiled run's first steps, where it compiles
        self._fresh_batches = False  # set while memory is measured (see _step)
        self._rng: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self.on_phase: Callable[[str], None] | None = None
        """Told, once, what this run's engine compiles in its first steps (:func:`compile_phase`), as it builds the
        first engine whose steps may compile: the runner's progress shows it (a minute of compiling on a GPU
        otherwise looks like a hang)."""
        self._phase_told = False
        self._eager_only = False  # set while every step is forced eager (an eager run's memory steps): nothing compiles

    @property
    def alive(self) -> bool:
        """False once the run has failed, or when the device cannot run its policy at all."""
        return self.result.status not in ("failed", "unsupported")

    # -- lifecycle ---------------------------------------------------------------------------------
    def build(self) -> None:
        """Fresh copy of the workload's initial weights, its optimizer, and an Engine for this policy."""
        self._setup(self._copy())

    def _copy(self) -> nn.Module:
        """The workload's initial weights on the device, with the run's RNG seeded (the first half of :meth:`build`)."""
        self.release()
        # Seeds CUDA too; the state is kept per run from here on. Each rank draws its own dropout masks, as
        # independent samples of one global batch would (the weights come from rank 0 whatever the seed).
        torch.manual_seed(self.seed + self.rank)
        cuda_state = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        self._rng = (torch.get_rng_state(), cuda_state)
        model = copy.deepcopy(self.workload.model).to(self.device)
        if self.workload.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if self.prepare is not None:
            self.prepare(model)
        return model

    def _setup(self, model: nn.Module) -> None:
        """The optimizer and the Engine for this policy, set up on ``model`` (the second half of :meth:`build`)."""
        optimizer = with_lr(self.workload.optimizer(model.parameters()), self.workload.lr)
        self.engine = Engine(
            self.policy, clip_grad_norm=self.workload.clip_grad_norm, accumulate=self.workload.accumulate,
            strategy=self.strategy, compile=self.compile, **self.engine_options,
        )
        self.model, self.optimizer = self.engine.setup(model, optimizer)
        self.model.train()
        self.steps_done, self.losses, self.times, self.compiled = 0, [], [], []
        phase = compile_phase(self.engine)
        if phase is not None and self.on_phase is not None and not (self._phase_told or self._eager_only):
            self._phase_told = True
            self.on_phase(phase)

    def release(self) -> None:
        """Drop the model, optimizer and engine so their memory can be reused."""
        self.model = self.optimizer = self.engine = None
        self.losses = []
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def fail(self, exc: BaseException) -> None:
        """Record ``exc`` as this run's failure and free its memory; the other runs go on."""
        log.debug("bench run %s failed", self.label, exc_info=exc)
        self.result.status, self.result.error = "failed", one_line(exc, with_type=True)
        self.release()

    @contextlib.contextmanager
    def _own_rng(self) -> Iterator[None]:
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            if self._rng is not None:
                torch.set_rng_state(self._rng[0])
                if self._rng[1] is not None:
                    torch.cuda.set_rng_state(self._rng[1], self.device)
            yield
            cuda_state = torch.cuda.get_rng_state(self.device) if devices else None
            self._rng = (torch.get_rng_state(), cuda_state)

    # -- one step ----------------------------------------------------------------------------------
    def _step(self) -> None:
        """One optimizer step: ``accumulate`` micro-batches, consecutive batches; its loss is their mean."""
        assert self.model is not None and self.engine is not None  # build() ran
        k = self.workload.accumulate
        losses = []
        for i in range(k):
            batch = self.batches[(self.steps_done * k + i) % len(self.batches)]
            if self._fresh_batches:  # measuring memory: the micro-batch is made, used and freed as a loader's would be
                batch = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, batch)
            with self.engine.autocast():
                loss = batch_loss(self.model, batch, self.workload.loss_fn)
            self.engine.backward(loss)
            self.engine.step()  # updates the weights at the window's last micro-batch
            losses.append(loss.detach())
        self.losses.append(losses[0] if k == 1 else torch.stack(losses).mean())
        self.steps_done += 1

    def train(self, steps: int, timed: bool, stop: Callable[[], bool] | None = None) -> None:
        """Run ``steps`` training steps; their times count when ``timed`` (warm-up steps do not). ``stop``, asked
        before each step, ends them early (a deadline); the times are read once at the end either way (on CUDA a
        read waits for the device: once per call, not per step, so the host still runs ahead as in training)."""
        with self._own_rng():
            for _ in range(steps):
                if stop is not None and stop():
                    break
                if timed:
                    # A step that compiles (an optimizer compiling its step at its second call, a recompile) is
                    # compilation, not a step time: flagged here by a counter read, left out in summarize().
                    graphs = graphs_compiled()
                    with self.timer.step():
                        self._step()
                    self.compiled.append(graphs_compiled() != graphs)
                else:
                    self._step()
            if timed:
                self.times.extend(self.timer.flush())

    # -- measured alone ----------------------------------------------------------------------------
    def measure_alone(self, warmup: int, flops: bool) -> None:
        """Memory, activations and FLOPs, taken on a throwaway copy while no other run holds memory.

        The first step counts saved activations, the second (when ``flops``, eager) counts FLOPs; the rest warm up.
        A compiled run times its first two steps instead: they hold the compilation (:attr:`first_steps`).
        Peaks cover the policy's setup and ``warmup`` steps (at least two, so optimizer state exists). Each
        micro-batch is a copy made as the step takes it, so the peak holds the micro-batch in use, as a loop over a
        loader would, not the bench's preloaded batches. The peak is :class:`~ampkit.memory._accounting.StepPeak`'s
        on the CPU (``ampkit memory``'s definition; none for a compiled run) and the allocator's on CUDA.
        """
        cuda = self.device.type == "cuda"
        self.release()
        gc.collect()  # once per policy (it costs ~0.1 s): the previous throwaway must be gone before peaks reset
        if cuda:
            create_library_workspaces(self.device)  # else the first policy measured (32-true) would carry them
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            base = torch.cuda.memory_allocated(self.device)
        reset_peak_rss()
        model = self._copy()
        # The CPU's peak is counted op by op under a dispatch mode, and only for an eager run: torch.compile skips,
        # for the rest of the process, a frame it first meets under one, and sees nothing inside compiled code. The
        # eager run stays eager throughout (an optimizer that compiles its own step, torchao's, compiles in the
        # timed run's warm-up), as ampkit memory's step does.
        live = StepPeak(model) if not cuda and self.compile is None else None
        self._fresh_batches = True
        # On CUDA too: the allocator would see a compiled step, but the throwaway engine's compile (its own code
        # object, so the timed engine compiles again) cost the H200's default bench more than 80 s in bf16-true-sr.
        self._eager_only = self.compile is None
        try:
            eager = torch.compiler.set_stance("force_eager") if self._eager_only else contextlib.nullcontext()
            with eager:
                self._measure_steps(model, warmup, flops, self._peak_window(live, base if cuda else 0))
        finally:
            self._fresh_batches = self._eager_only = False
        assert self.model is not None and self.optimizer is not None and self.engine is not None
        breakdown = training_state_bytes(self.model, [self.optimizer], self.engine.masters)
        breakdown["activations"] = self.result.activation_bytes or 0
        self.result.memory_breakdown = breakdown
        self.result.peak_rss_bytes = peak_rss_bytes()
        self.release()

    @contextlib.contextmanager
    def _peak_window(self, live: StepPeak | None, base: int) -> Iterator[None]:
        """The peak of the policy's setup and first two steps, ``ampkit memory``'s window: the allocator's on CUDA,
        ``live``'s on the CPU (none for a compiled CPU run, rather than one of another definition)."""
        with live if live is not None else contextlib.nullcontext():
            yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.result.peak_memory_bytes = torch.cuda.max_memory_allocated(self.device) - base
        elif live is not None:
            self.result.peak_memory_bytes = live.peak

    def _measure_steps(self, model: nn.Module, warmup: int, flops: bool, window: contextlib.AbstractContextManager[None]) -> None:
        compiled = self.compile is not None
        # An eager run's measuring steps stay eager even where an optimizer compiles its own step (torchao's, under
        # bf16-true-sr): torch.compile refuses to trace under the counters' hooks and modes. It compiles in the
        # warm-up steps that follow.
        measuring = contextlib.nullcontext() if compiled else torch.compiler.set_stance("force_eager")
        with window:  # the peak covers the setup and two steps, as ampkit memory's does; the FLOP count comes after
            self._setup(model)
            assert self.model is not None
            with self._own_rng():
                with self.timer.step(), SavedActivations(self.model) as saved, measuring:
                    self._step()  # a compiled run compiles here
                self.result.activation_bytes = saved.bytes
                if compiled:  # timed too: a second step may recompile (e.g. once the optimizer state exists)
                    with self.timer.step():
                        self._step()
                else:  # the second step, whose peak holds the optimizer state the first one created
                    self._step()
        rest = max(0, warmup - 2)
        with self._own_rng():
            # Counted outside the peak: FlopCounterMode holds what it counts (with activation checkpointing the
            # peak grew by half), and ampkit memory's step counts no FLOPs.
            if flops and not compiled:  # eager only: a compiled step would trace again (the runner copies the count)
                rest = max(0, rest - 1)
                try:
                    with torch.compiler.set_stance("force_eager"):
                        counted = count_flops(self._step)
                    self.result.flops_per_step = float(counted.total)
                    self.result.flops_by_format = {k: float(v) for k, v in counted.by_format.items()}
                    self.result.recomputed_flops = float(counted.recomputed)
                except Exception as exc:  # noqa: BLE001 - counting is a nicety; a model it cannot trace still gets timed
                    log.warning("FLOP counting failed under %s (%s); no FLOP/s for this run", self.precision, one_line(exc, with_type=True))
                    self._step()
            for _ in range(rest):
                self._step()
        first = self.timer.flush()
        self.first_steps = first if compiled else []

    # -- after training ----------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, batches: Sequence[Batch]) -> None:
        """Compute the workload's eval metric on ``batches`` under this policy's forward context.

        Under DDP only rank 0 evaluates, on the whole eval set and the unwrapped model: the weights are the same
        on every rank, and DDP's forward would broadcast buffers, a collective the other ranks would not join.
        """
        if self.rank != 0 or self.workload.metric is None or not batches or self.model is None or self.engine is None:
            return
        metric = self.workload.metric()
        # Each batch also scored alone, from the same outputs (no second forward): the spread of these figures is
        # the eval noise the verdicts hold gaps to (ampkit.bench._quality). Read back after the loop, not in it.
        alone = [self.workload.metric() for _ in batches] if len(batches) > 1 else []
        model = unwrap(self.model)
        model.eval()
        try:
            with self.engine.autocast():
                for i, batch in enumerate(batches):
                    output, target = run_batch(model, batch)
                    metric.update(output, target)
                    if alone:
                        alone[i].update(output, target)
        finally:
            model.train()
        values = metric.compute()
        self.result.eval_metric_name = metric.name
        self.result.eval_metric = values.get(metric.name)
        self.result.eval_metrics = dict(values)
        try:
            self.result.eval_batch_metrics = [m.compute().get(metric.name) for m in alone]
        except Exception as exc:  # noqa: BLE001  # a user's metric may not score one batch alone: the noise is then unmeasured
            log.warning("eval noise not measured under %s: scoring one eval batch alone failed (%s)", self.precision, one_line(exc, with_type=True))

    def summarize(self) -> None:
        """Turn the recorded times and losses into the result's figures (one host read of the losses; see
        :func:`~ampkit.bench._run_summary.summarize_run`). Under DDP every rank must call it (one ``all_gather_object``)."""
        losses: list[float] = torch.stack(self.losses).float().cpu().tolist() if self.losses else []
        # The global batch (every rank's rows) of every micro-batch of the step.
        items = self.workload.items_per_batch * self.workload.accumulate
        summarize_run(self.result, losses, list(self.times), list(self.compiled), first_steps=self.first_steps, items_per_step=items, world=self.world)
        if self.engine is not None:
            self.result.skipped_steps = self.engine.skipped_steps
            self.result.final_loss_scale = self.engine.scale
