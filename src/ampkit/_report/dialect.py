"""Advice in the terms of the framework the model came from: one configuration, printed as the lines to paste.

Each tool describes what it recommends as an :class:`Advice` (``ampkit tune``'s winner, ``ampkit doctor``'s
prescription, the policy ``ampkit bench`` found pays), and :func:`paste_code` prints it in the dialect of the
framework the model came from (``Workload.extra["framework"]``): an ``ampkit.Engine`` for a plain PyTorch model,
``L.Trainer`` for a LightningModule, ``TrainingArguments`` and a ``Trainer`` for a Hugging Face model. The
framework's own switch is printed where it has one (``precision="bf16-mixed"``, ``bf16=True``, ``torch_compile=True``),
ampkit's integration where the advice needs what only ampkit does (a policy the framework does not name, modules kept
in fp32, a scaler setting), and plain torch where no framework has a switch (threads, channels_last, regional compile).

    >>> advice = Advice(precision="bf16-true-masters", accumulate=2, clip_grad_norm=1.0, device="cuda")
    >>> print(paste_code(advice, "lightning"))
    import lightning as L
    <BLANKLINE>
    from ampkit.lightning import AmpkitPrecision
    <BLANKLINE>
    trainer = L.Trainer(plugins=[AmpkitPrecision("bf16-true-masters")], accumulate_grad_batches=2, gradient_clip_val=1.0)
    trainer.fit(model)
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["AS_GIVEN", "FRAMEWORKS", "Advice", "check_framework", "gradient_checkpointing_of", "paste_code"]

AS_GIVEN: Literal["as given"] = "as given"
"""``Advice.clip_grad_norm``'s default: the advice says nothing of clipping (the doctor's), so nothing is printed."""

FRAMEWORKS: dict[str, str] = {"lightning": "Lightning", "transformers": "Hugging Face Trainer"}
"""The frameworks a model can come from (``Workload.extra["framework"]``) and their names in words; a model from
none of them (plain PyTorch, the tag absent) gets the ``ampkit.Engine`` form."""

_LIGHTNING_NATIVE = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")
"""The policies ``L.Trainer(precision=...)`` names itself, with the same meaning."""
_HF_NATIVE = {"32-true": None, "bf16-mixed": "bf16", "16-mixed": "fp16", "tf32": "tf32"}
"""The policies ``TrainingArguments`` has a flag for (32-true: its default, no flag)."""
_HF_LOADER = {"num_workers": "dataloader_num_workers", "pin_memory": "dataloader_pin_memory",
              "prefetch_factor": "dataloader_prefetch_factor", "persistent_workers": "dataloader_persistent_workers"}  # fmt: skip
_LOADER_KEYS = (*_HF_LOADER, "torch_threads", "non_blocking")


@dataclass(kw_only=True, slots=True)
class Advice:
    """One training configuration to recommend; every field left at its default is printed as nothing.

    >>> Advice(precision="bf16-mixed", compile="all")
    Traceback (most recent call last):
    ...
    ValueError: Advice(compile='all'): give None (eager), 'regional' (each repeated block) or 'model' (the whole model).
    """

    precision: str = "32-true"
    """The ampkit policy, by name or alias (kept as :func:`ampkit.get_policy` names it)."""
    keep_fp32: tuple[str, ...] = ()
    """Module names the policy keeps in fp32."""
    scaler: Mapping[str, float] | None = None
    """:class:`ampkit.ScalerConfig` keyword arguments (the doctor's loss scale); None: the policy's default."""
    micro_batch: int | None = None
    """Rows of one micro-batch; None: the batch as the user has it (no loader line is printed)."""
    accumulate: int = 1
    """Micro-batches per optimizer step."""
    given_micro_batch: int | None = None
    """The user's own micro-batch: the frameworks' forms set the batch only where the advice changes it (the Engine
    form always has its DataLoader line); None: not known."""
    given_accumulate: int = 1
    """The user's own accumulation: when ``accumulate`` is larger, the batch line says how it splits the user's batch."""
    clip_grad_norm: float | None | Literal["as given"] = AS_GIVEN
    """The gradients' total-norm clip as measured; None: measured without clipping; :data:`AS_GIVEN`: not advised."""
    compile: str | None = None
    """None (eager), ``"regional"`` (each repeated block) or ``"model"`` (the whole model)."""
    fused_step: bool | None = None
    """``Engine(fused_step=...)``: ampkit's fused master step (no framework has a switch for it)."""
    recompute: bool = False
    """Recompute each repeated block's activations in backward."""
    gradient_checkpointing: bool | None = None
    """The Hugging Face model has its own gradient checkpointing (``supports_gradient_checkpointing``): recompute is
    then ``TrainingArguments(activation_checkpointing=True)``; otherwise (False, or None: not known) :func:`ampkit.recompute`."""
    threads: int | None = None
    """``torch.set_num_threads``; None: as the process has it."""
    loader: Mapping[str, Any] = field(default_factory=dict)
    """DataLoader settings that differ from the user's: its keyword arguments, ``torch_threads`` (the training
    process's threads beside the workers) and ``non_blocking`` (how batches are copied to the device)."""
    channels_last: bool = False
    """The model and its 4-D inputs in ``torch.channels_last``."""
    device: str | None = None
    """The device type the advice was measured on (``cpu``, ``cuda``); None: not known. On ``cpu`` the framework
    forms train on the CPU (``accelerator="cpu"``, ``use_cpu=True``), and fp16 takes ampkit's policy: Lightning's
    ``"16-mixed"`` runs bf16 on a CPU."""

    def __post_init__(self) -> None:
        from ..policy import get_policy  # deferred: printing advice needs no torch until an Advice is made

        self.precision = get_policy(self.precision).name  # an alias ("bf16") resolved once, here; a typo refused naming the closest
        if self.compile not in (None, "regional", "model"):
            raise ValueError(f"Advice(compile={self.compile!r}): give None (eager), 'regional' (each repeated block) or 'model' (the whole model).")
        for name in ("accumulate", "given_accumulate", "micro_batch", "given_micro_batch", "threads"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"Advice({name}={value!r}): give a whole number >= 1" + ("." if "accumulate" in name else " or None."))
        clip = self.clip_grad_norm
        if clip is not None and clip != AS_GIVEN and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or not math.isfinite(clip) or clip <= 0):
            raise ValueError(f"Advice(clip_grad_norm={clip!r}): give a positive finite norm, None (no clipping) or AS_GIVEN (not advised).")
        unknown = sorted(set(self.loader) - set(_LOADER_KEYS))
        if unknown:
            raise ValueError(f"Advice(loader=...): unknown setting(s) {', '.join(unknown)}; the settings are {', '.join(_LOADER_KEYS)}.")
        self.keep_fp32 = tuple(self.keep_fp32)

    def batch_comment(self, *also: str) -> str:
        """The comment of the line that sets the batch: how the advice splits the user's batch into more
        micro-batches (where it does), then ``also``; empty when there is nothing to say."""
        said = list(also)
        if self.micro_batch is not None and self.accumulate > self.given_accumulate:
            said.insert(0, f"{self.micro_batch} x {self.accumulate} micro-batches = your batch of {self.micro_batch * self.accumulate}")
        return f"  # {'; '.join(said)}" if said else ""


def check_framework(name: object) -> str | None:
    """``name`` as a framework tag (``Workload.extra["framework"]``): None for plain PyTorch, else one of
    :data:`FRAMEWORKS`; anything else raises ValueError naming them.

    >>> check_framework("lightning"), check_framework(None)
    ('lightning', None)
    """
    if name is None or name in FRAMEWORKS:
        return name  # type: ignore[return-value]
    raise ValueError(f"framework {name!r}: ampkit prints advice for {', '.join(map(repr, FRAMEWORKS))} or None (plain PyTorch: ampkit.Engine).")


def gradient_checkpointing_of(extra: Mapping[str, Any]) -> bool | None:
    """Whether a Hugging Face model has its own gradient checkpointing, as ``Workload.extra`` records it (its
    ``supports_gradient_checkpointing``); None: not recorded.

    >>> gradient_checkpointing_of({"framework": "transformers", "supports_gradient_checkpointing": True}), gradient_checkpointing_of({})
    (True, None)
    """
    value = extra.get("supports_gradient_checkpointing")
    return None if value is None else bool(value)


def paste_code(advice: Advice, framework: str | None = None) -> str:
    """The lines to paste into a training script of ``framework`` (None: plain PyTorch, as ``ampkit.Engine``) that
    train as ``advice`` says. ``model``, ``optimizer``, ``dataset`` (``train_dataset`` for a Hugging Face Trainer)
    are the user's own names.

    >>> print(paste_code(Advice(precision="bf16-mixed", device="cpu"), "transformers"))
    from transformers import Trainer, TrainingArguments
    <BLANKLINE>
    args = TrainingArguments(use_cpu=True, bf16=True)  # beside your other arguments
    trainer = Trainer(model=model, args=args, train_dataset=train_dataset)
    trainer.train()
    """
    framework = check_framework(framework)
    if framework == "lightning":
        return _lightning(advice)
    if framework == "transformers":
        return _transformers(advice)
    return _engine(advice)


def _ampkit_kwargs(advice: Advice) -> list[str]:
    """The integration's arguments beyond the policy: the modules kept in fp32 and the scaler's settings, the advice
    only ampkit's integrations can take (strings as JSON writes them: valid Python, in the frameworks' double quotes)."""
    kwargs = [f"keep_fp32={json.dumps(list(advice.keep_fp32))}"] if advice.keep_fp32 else []
    return kwargs + ([f"scaler={_scaler(advice)}"] if advice.scaler else [])


def _scaler(advice: Advice) -> str:
    return "ampkit.ScalerConfig(" + ", ".join(f"{k}={float(v)!r}" for k, v in (advice.scaler or {}).items()) + ")"


def _loader_kwargs(advice: Advice) -> tuple[dict[str, Any], int | None, bool]:
    """(the DataLoader's keyword arguments, the process's threads beside its workers, copy with non_blocking)."""
    kwargs = {k: v for k, v in advice.loader.items() if k not in ("torch_threads", "non_blocking")}
    return kwargs, advice.loader.get("torch_threads"), bool(advice.loader.get("non_blocking"))


def _new_micro_batch(advice: Advice) -> int | None:
    """The micro-batch where the advice changes the user's (a framework's form sets nothing else); else None."""
    return advice.micro_batch if advice.micro_batch != advice.given_micro_batch else None


def _loader_line(advice: Advice, batch: int | None) -> str:
    """``loader = torch.utils.data.DataLoader(dataset, ...)`` with ``batch`` and the advice's settings; empty when it
    sets neither."""
    kwargs, _, _ = _loader_kwargs(advice)
    if batch is None and not kwargs:
        return ""
    args = ["dataset"] + ([f"batch_size={batch}"] if batch is not None else [])
    args += [f"{k}={v!r}" for k, v in sorted(kwargs.items())]
    return f"loader = torch.utils.data.DataLoader({', '.join(args)})"


def _before(advice: Advice, recompute: bool, compile_lines: bool) -> list[str]:
    """What the frameworks have no switch for, done to the model before training: threads, recompute, channels_last,
    regional compile (the whole model: ``compile_lines`` says whether the framework leaves it to torch too)."""
    lines = [f"torch.set_num_threads({advice.threads})"] if advice.threads is not None else []
    if recompute:
        lines.append("ampkit.recompute(model, ampkit.memory.repeated_blocks(model))  # recompute each block in backward")
    if advice.channels_last:
        lines.append("model = model.to(memory_format=torch.channels_last)  # convolutions in NHWC")
    if advice.compile == "regional":
        # repeated_blocks gives names; nn.Module.compile() compiles a block in place (its parameters stay the model's)
        lines += ["for name in ampkit.memory.repeated_blocks(model):  # compile each repeated block",
                  "    model.get_submodule(name).compile()"]  # fmt: skip
    elif advice.compile == "model" and compile_lines:
        lines.append("model = torch.compile(model)")
    if advice.fused_step:
        lines.append("# measured with ampkit's fused master step (ampkit.Engine(fused_step=True)), which this framework has no switch for")
    return lines


def _imports(third_party: list[str], ampkit_lines: list[str], body: list[str]) -> list[str]:
    """The import block the body needs: ``torch`` and ``ampkit`` only where a line uses them."""
    text = "\n".join(body)
    head = sorted(third_party + (["import torch"] if "torch." in text else []), key=lambda s: s.split()[1])
    own = (["import ampkit"] if "ampkit." in text else []) + ampkit_lines
    return head + ([""] + own if own else []) + [""]


def _engine(advice: Advice) -> str:
    """The ``ampkit.Engine`` form, for a plain PyTorch loop."""
    args = [repr(advice.precision)]
    if advice.accumulate > 1:
        args.append(f"accumulate={advice.accumulate}")
    if advice.clip_grad_norm not in (None, AS_GIVEN):
        args.append(f"clip_grad_norm={advice.clip_grad_norm:g}")
    if advice.keep_fp32:
        args.append(f"keep_fp32={list(advice.keep_fp32)!r}")
    if advice.scaler:
        args.append(f"scaler={_scaler(advice)}")
    if advice.compile is not None:
        args.append("compile=True" if advice.compile == "model" else "compile='regional'")
    if advice.fused_step is not None:
        args.append(f"fused_step={advice.fused_step}")
    lines = ["import ampkit", "import torch", ""]
    if advice.threads is not None:
        lines.append(f"torch.set_num_threads({advice.threads})")
    if advice.recompute:
        lines.append("ampkit.recompute(model, ampkit.memory.repeated_blocks(model))  # before setup: recompute each block in backward")
    if advice.channels_last:
        lines.append("model = model.to(memory_format=torch.channels_last)  # before setup: convolutions in NHWC")
    lines.append(f"engine = ampkit.Engine({', '.join(args)})")
    lines.append("model, optimizer = engine.setup(model, optimizer)")
    loader = _loader_line(advice, advice.micro_batch)
    _, threads, non_blocking = _loader_kwargs(advice)
    if loader:
        lines.append(loader + advice.batch_comment())
    if threads is not None:
        lines.append(f"torch.set_num_threads({threads})  # the cores the loader's workers leave")
    if advice.channels_last:
        lines.append("# each batch's 4-D inputs: images = images.to(device, memory_format=torch.channels_last)")
    if non_blocking:
        lines.append("# copy each batch with .to(device, non_blocking=True)")
    return "\n".join(lines)


def _lightning(advice: Advice) -> str:
    """``L.Trainer``: Lightning's own ``precision=`` where it names the policy and nothing ampkit-only is needed, else
    ``plugins=[AmpkitPrecision(...)]`` (never both: Lightning refuses ``precision=`` beside a precision plugin)."""
    cpu_fp16 = advice.device == "cpu" and advice.precision == "16-mixed"  # Lightning would run bf16 instead
    plugin = advice.precision not in _LIGHTNING_NATIVE or bool(_ampkit_kwargs(advice)) or cpu_fp16
    kwargs = ['accelerator="cpu"'] if advice.device == "cpu" else []
    if plugin:
        kwargs.append(f"plugins=[AmpkitPrecision({', '.join([json.dumps(advice.precision), *_ampkit_kwargs(advice)])})]")
    else:
        kwargs.append(f"precision={json.dumps(advice.precision)}")
    if advice.accumulate > 1 or advice.given_accumulate > 1:
        kwargs.append(f"accumulate_grad_batches={advice.accumulate}")
    if advice.clip_grad_norm not in (None, AS_GIVEN):
        kwargs.append(f"gradient_clip_val={float(advice.clip_grad_norm)!r}")  # type: ignore[arg-type]
    body = _before(advice, advice.recompute, compile_lines=True)
    body.append(f"trainer = L.Trainer({', '.join(kwargs)})")
    _, threads, _ = _loader_kwargs(advice)  # non_blocking: Lightning copies batches to a GPU with it already
    loader = _loader_line(advice, _new_micro_batch(advice))
    if loader:
        body.append(loader + advice.batch_comment("in place of what your train_dataloader() returns"))
    if threads is not None:
        body.append(f"torch.set_num_threads({threads})  # the cores the loader's workers leave")
    if advice.channels_last:
        body.append("# in training_step, each batch's 4-D inputs: x = x.to(memory_format=torch.channels_last)")
    body.append("trainer.fit(model, train_dataloaders=loader)" if loader else "trainer.fit(model)")
    own = ["from ampkit.lightning import AmpkitPrecision"] if plugin else []
    return "\n".join(_imports(["import lightning as L"], own, body) + body)


def _transformers(advice: Advice) -> str:
    """``TrainingArguments`` with the levers the advice sets, and the plain ``Trainer``, or ``AmpkitTrainer`` where the
    policy has no flag (or fp16 on a CPU, or something ampkit-only is needed)."""
    flag = _HF_NATIVE.get(advice.precision, "ampkit")
    ampkit_trainer = flag == "ampkit" or bool(_ampkit_kwargs(advice)) or (flag == "fp16" and advice.device == "cpu")
    kwargs = ["use_cpu=True"] if advice.device == "cpu" else []
    if not ampkit_trainer and flag is not None:
        kwargs.append(f"{flag}=True")
    if _new_micro_batch(advice) is not None:
        kwargs.append(f"per_device_train_batch_size={advice.micro_batch}")
    if advice.accumulate > 1 or advice.given_accumulate > 1:
        kwargs.append(f"gradient_accumulation_steps={advice.accumulate}")
    if advice.clip_grad_norm != AS_GIVEN:  # the Trainer clips at 1.0 unless told: no clipping is max_grad_norm=0.0
        kwargs.append(f"max_grad_norm={float(advice.clip_grad_norm or 0.0)!r}")
    if advice.compile == "model":
        kwargs.append("torch_compile=True")
    checkpointing = advice.recompute and bool(advice.gradient_checkpointing)
    if checkpointing:  # transformers 5 renamed it (gradient_checkpointing= warns as deprecated)
        kwargs.append("activation_checkpointing=True")
    loader_kwargs, threads, non_blocking = _loader_kwargs(advice)
    kwargs += [f"{_HF_LOADER[k]}={v!r}" for k, v in sorted(loader_kwargs.items())]
    if non_blocking:
        kwargs.append('accelerator_config={"non_blocking": True}')
    body = _before(advice, advice.recompute and not checkpointing, compile_lines=False)
    body.append(f"args = TrainingArguments({', '.join(kwargs)})" + advice.batch_comment("beside your other arguments"))
    if threads is not None:
        body.append(f"torch.set_num_threads({threads})  # the cores the loader's workers leave")
    trainer_args = "model=model, args=args, train_dataset=train_dataset"
    if ampkit_trainer:
        body.append(f"trainer = AmpkitTrainer({', '.join([trainer_args, f'precision={json.dumps(advice.precision)}', *_ampkit_kwargs(advice)])})")
    else:
        body.append(f"trainer = Trainer({trainer_args})")
    if advice.channels_last:
        body.append("# each batch's 4-D inputs in channels_last: a data_collator that returns x.to(memory_format=torch.channels_last)")
    body.append("trainer.train()")
    third = ["from transformers import TrainingArguments" if ampkit_trainer else "from transformers import Trainer, TrainingArguments"]
    own = ["from ampkit.transformers import AmpkitTrainer"] if ampkit_trainer else []
    return "\n".join(_imports(third, own, body) + body)
