"""The grammar of the ``ampkit`` command: every subcommand's parser, declared apart from its implementation.

``ampkit --help`` and ``ampkit bench --help`` build these parsers and nothing else: this module imports no
torch, no rich and no tool, and each subcommand's implementation (``ampkit.cli._<command>.run``, with what it
imports) is imported only when that command runs.

    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="ampkit")
    >>> subparsers = parser.add_subparsers(dest="command")
    >>> for add in (add_bench, add_doctor, add_env, add_memory):
    ...     add(subparsers)
    >>> args = parser.parse_args(["memory", "--size", "tiny", "--device-memory", "1KiB"])
    >>> args.size, args.device_memory, callable(args.func)
    ('tiny', 1024, True)
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path

from ._checks import memory_size, non_negative, positive

__all__ = ["SIZES", "add_bench", "add_doctor", "add_env", "add_memory", "add_profile", "add_tune"]

SIZES = ("tiny", "small", "large")
"""The built-in workload sizes, as :data:`ampkit.workloads.SIZES` (a test holds the two equal): repeated here
because that module imports torch, which ``--help`` does without."""


def _runs(command: str) -> Callable[[argparse.Namespace], int]:
    """``ampkit.cli._<command>.run``, imported (and looked up, so a patched ``run`` is the one called) when called."""

    def run(args: argparse.Namespace) -> int:
        return int(importlib.import_module(f"{__package__}._{command}").run(args))

    return run


_DEVICE_HELP = "cpu, cuda or cuda:N (default: the GPU if there is one)"
_TRAINING_SEED = "the weights, the data order and dropout"


def _add_workload(p: argparse.ArgumentParser, *, seeds: str = _TRAINING_SEED) -> None:
    """What bench, doctor and memory run: a built-in workload (``-w``, ``--size``) or the user's own model and
    data (``--model``, ``--data``), and ``--seed``, whose help names what it ``seeds``."""
    p.add_argument("-w", "--workload", help="built-in workload: digits, digits-aug, segment, gpt, resnet (default: the one for the device)")
    p.add_argument("--size", default="auto", choices=("auto", *SIZES), help="built-in workload size (default: auto: small on CPU, large on GPU)")
    p.add_argument(
        "--model", metavar="MODULE:FACTORY",
        help="your model: a no-argument callable returning an nn.Module or a LightningModule (its training_step is the loss, "
        "configure_optimizers() the optimizer, its own dataloaders the data without --data); or hf:PATH, a local Hugging "
        "Face model folder (with weights: from_pretrained; with only config.json: random init from --seed; nothing is "
        "downloaded; without --data, a causal LM trains on text tokenized by the folder's tokenizer, else random tokens)",
    )
    p.add_argument(
        "--data", metavar="MODULE:FACTORY",
        help="your data: a no-argument callable returning batches ((inputs, targets) pairs or dicts of model keyword "
        "arguments), a DataLoader, a BenchData, a datasets.Dataset (collated into batches of --batch-size rows, default 8; "
        "a DatasetDict's validation split is the eval) or a LightningDataModule",
    )
    p.add_argument("--seed", type=int, default=0, help=f"seed of {seeds} (default: 0)")


def _add_device(p: argparse.ArgumentParser, help: str = _DEVICE_HELP) -> None:
    """``--device``: where the command runs (or, for memory, what it predicts for); None picks the default."""
    p.add_argument("--device", help=help)


def _add_out(p: argparse.ArgumentParser, *, writes: str) -> None:
    """``--out DIR``: the folder the command ``writes`` its files to (laid out by :func:`ampkit._report.out_dir.write_out`)."""
    p.add_argument("--out", type=Path, metavar="DIR", help=f"write {writes} here")


def add_bench(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``bench`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "bench",
        help="train one workload under several precision policies and compare time, memory and accuracy",
        description=(
            "Train the same model from the same weights on the same batches under several precision policies, "
            "interleaved, and report step time, throughput, memory, loss, eval metric and a verdict per policy "
            "against 32-true."
        ),
    )
    _add_workload(p)
    p.add_argument("--precision", help="comma-separated policies or aliases (default: every policy this device runs fast); 32-true always runs as the reference")
    p.add_argument("--steps", type=positive, help="optimizer steps per policy, warm-up included (default: the workload's)")
    p.add_argument("--warmup", type=non_negative, help="leading steps excluded from timing (default: the workload's)")
    p.add_argument("--rounds", type=positive, default=5, help="interleaving rounds the timed steps are split into (default: 5)")
    _add_device(p)
    p.add_argument(
        "--tolerance", metavar="X",
        help="how far worse than 32-true's a policy's eval metric may land and still count as 'as good', in the metric's "
        "terms: absolute for accuracy and mIoU (0.01: one point) and for eval loss (0.01: in the loss's units), a fraction "
        "of 32-true's figure for perplexity (0.01: 1%%), a BenchData metric's as its own 'relative' says. The eval noise "
        "measured on the eval batches (its 95%% band) takes its place where larger, so 0 still allows the noise. "
        "Default: the metric's own (0.02 for accuracy, mIoU, perplexity and eval loss)",
    )
    p.add_argument(
        "--batch-size", type=positive, metavar="N",
        help="rows per training batch of a built-in workload (default: the size's) or of a datasets.Dataset from --data "
        "(default: 8); other --data sets its own",
    )
    p.add_argument(
        "--accumulate", type=positive, default=1, metavar="K",
        help="accumulate gradients over K batches per optimizer step: a step is then K batches, and step time and "
        "throughput count all of them (default: 1)",
    )
    p.add_argument(
        "--lr", type=float, metavar="X",
        help="one learning rate for every policy's optimizer (default: the workload's); a smaller one shows which "
        "16-bit policies lose updates",
    )
    p.add_argument("--clip", metavar="X", help="clip gradients to total norm X; 0 or none: no clipping (default: the workload's, 1.0)")
    p.add_argument(
        "--compile", nargs="?", const="model", choices=("model", "regional"),
        help="also run each policy compiled with torch.compile, side by side with its eager run: the whole model, or "
        "each repeated block with --compile regional; the compile time is reported apart from the step time",
    )
    _add_out(p, writes="results.json, report.md and PNG plots")
    p.add_argument("--tensorboard", type=Path, metavar="DIR", help="log loss curves and summary figures for TensorBoard here")
    p.add_argument(
        "--no-progress", action="store_true",
        help="no progress on stderr (by default a bar on a terminal; in a log, a line per run started, starting to "
        "compile and done, and at most one every 30 s between)",
    )
    p.add_argument(
        "--nproc", type=positive, metavar="N",
        help="train every policy under DDP in N processes on this machine, started through torchrun; each process "
        "trains 1/N of every batch (the batch rows must divide by N). On the CPU each process gets cores/N threads "
        "(OMP_NUM_THREADS, unless you set it). Default: 1",
    )
    _add_fp8(p)
    p.set_defaults(func=_runs("bench"))


def add_doctor(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``doctor`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "doctor",
        help="per-layer fp16/bf16 numerics of a model: underflow, overflow, the loss scale and the layers to keep in fp32",
        description=(
            "Train a few fp32 steps of a model with every module recorded; report, per module, how activations, "
            "weights and gradients fit fp16 and bf16; recommend a policy, a loss scale and the modules to keep in "
            "fp32, checked by one step under the policy against fp32."
        ),
    )
    _add_workload(p)
    p.add_argument("--precision", help="tailor for this policy (e.g. 16-mixed for a GPU without bf16); default: choose among the fast ones")
    p.add_argument("--steps", type=positive, default=3, help="fp32 reference steps to collect statistics over (default: 3)")
    p.add_argument(
        "--update-steps", type=non_negative, default=8,  # numerics.doctor.UPDATE_STEPS (torch is not imported here)
        help="steps of bf16-true (updates audited) beside 32-true, then of the remedies if updates are lost (default: 8; 0: no check)",
    )
    _add_device(p)
    p.add_argument("--top", type=non_negative, default=15, help="modules shown in the table, worst first (default: 15)")
    p.add_argument(
        "--compile", nargs="?", const="model", choices=("model", "regional"), metavar="{model,regional}",
        help="also run the recommended policy's step compiled (Engine(compile=...): the whole model, or each repeated "
        "block with 'regional') and compare it with the eager step, module by module (default: model)",
    )
    p.add_argument(
        "--fp8-recipe", choices=("tensorwise", "rowwise", "none"), default="tensorwise",
        help="cast every Linear's input, weight and output gradient as this torchao float8 recipe would and report what flushes to zero (default: tensorwise; none: no fp8 check)",
    )
    p.add_argument("--compile-backend", metavar="NAME", help="torch.compile backend for --compile, e.g. aot_eager to tell the compiler's differences from tracing's (default: inductor)")
    _add_out(p, writes="doctor.json, report.md and PNG histograms")
    p.add_argument("--no-progress", action="store_true", help="no progress on stderr (by default a bar on a terminal, a line per phase in a log)")
    p.set_defaults(func=_runs("doctor"))


def add_env(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``env`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "env",
        help="show versions, devices and which precision policies run fast here",
        description="Show versions, devices and which precision policies run (and run fast) on each device.",
    )
    p.add_argument("--json", action="store_true", help="print the same facts as one JSON object")
    # Every command takes --no-progress, so a script can pass it to each alike; env reads its facts in a second or
    # two and shows no progress to turn off.
    p.add_argument("--no-progress", action="store_true", help="accepted as every command takes it; env shows no progress")
    p.set_defaults(func=_runs("env"))


def _add_fp8(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--fp8", nargs="?", const="auto", metavar="GPU",
        help="print which Linear layers pay in fp8 on GPU (e.g. H100, L4; default: this GPU, else H100), predicted by a "
        "roofline at the batch's rows; printed anyway when an fp8 policy is measured",
    )


def add_memory(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``memory`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "memory",
        help="predict the memory of a training step per precision policy (and the largest batch that fits)",
        description=(
            "Run one training step of a model on fake tensors under each precision policy and print its memory: "
            "parameters, gradients, optimizer state, master weights, saved activations, their total, and the peak of "
            "live tensors. Nothing is allocated on the device."
        ),
    )
    _add_workload(p, seeds="the built-in workload")
    p.add_argument("--batch-size", type=positive, help="batch size to predict for (default: the data's)")
    p.add_argument("--precision", help="comma-separated policies or aliases (default: every policy the device supports)")
    _add_device(p, "the device to predict for: cpu or cuda (default: cuda if visible, else cpu); no GPU is needed")
    p.add_argument("--device-memory", type=memory_size, metavar="SIZE", help="memory to fit in, e.g. 24GiB or 80GB: adds the largest batch that fits per policy")
    _add_fp8(p)
    p.add_argument("--json", action="store_true", help="print JSON (one object per policy) instead of the table")
    p.add_argument(
        "--no-progress", action="store_true",
        help="no progress on stderr (by default a bar on a terminal; in a log, a line per run started, starting to "
        "compile and done, and at most one every 30 s between)",
    )
    p.set_defaults(func=_runs("memory"))


def add_profile(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``profile`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "profile",
        help="where a training step's time goes (data, copy, forward, backward, optimizer, syncs, device idle) and which change gives it back, measured",
        description=(
            "Train a workload through a DataLoader and split each step's time into waiting for data, the copy to the "
            "device, forward, backward and the optimizer; find the host syncs and the lines that make them; read the "
            "casts' and the optimizer's share from torch.profiler (and the GPU's idle time on CUDA); then time the "
            "DataLoader settings worth trying on the same step, and advise the changes that measurably help."
        ),
    )
    _add_workload(p)
    p.add_argument("--precision", help="the policy to train under (default: bf16-mixed where it runs fast here, else 32-true)")
    _add_device(p)
    p.add_argument("--steps", type=positive, default=20, help="steps whose phases are timed (default: 20)")
    p.add_argument("--warmup", type=positive, default=3, help="steps run before any measurement (default: 3)")
    p.add_argument("--plain-steps", type=non_negative, default=10, help="steps timed whole and unprofiled after the warm-up: the plain step the profiler's overhead is read against (default: 10)")
    p.add_argument("--sync-steps", type=non_negative, default=5, help="steps in which host syncs are counted (default: 5)")
    p.add_argument("--trace-steps", type=non_negative, default=3, help="steps traced by torch.profiler for the op shares and device idle (default: 3)")
    p.add_argument("--no-trials", action="store_true", help="do not time the DataLoader's variants (num_workers, pin_memory, persistent_workers, prefetch_factor)")
    p.add_argument(
        "--compile", nargs="?", const="model", choices=("model", "regional"), metavar="{model,regional}",
        help="profile the step compiled with torch.compile: the whole model, or each repeated block with 'regional' (default: model)",
    )
    _add_out(p, writes="profile.json, report.md and PNG plots")
    p.add_argument("--trace", action="store_true", help="with --out: also write the traced steps as a Chrome trace (trace.json, for chrome://tracing or ui.perfetto.dev)")
    p.add_argument("--no-progress", action="store_true", help="no progress on stderr (by default a bar with the time left on a terminal, a line per stage in a log)")
    p.set_defaults(func=_runs("profile"))


def add_tune(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``tune`` subcommand to ``subparsers``."""
    p = subparsers.add_parser(
        "tune",
        help="find the fastest training configuration that keeps fp32's accuracy (policy, compile, micro-batch, recompute, loader, threads), measured",
        description=(
            "Search the precision policy, torch.compile, the fused master step, micro-batch with accumulation (your global "
            "batch unchanged), recompute, the DataLoader's settings and CPU threads: prune what cannot pay or fit, measure "
            "the rest in short interleaved trials against your starting point (fp32, your batch), hold the fastest to "
            "fp32's accuracy and its measured noise, and print the winner as code to paste."
        ),
    )
    _add_workload(p)
    _add_device(p)
    p.add_argument("--budget", type=positive, default=300, metavar="SECONDS", help="wall-clock budget: trials stop, and the report lists what was not tried (default: 300)")
    p.add_argument("--run-steps", type=positive, default=1000, metavar="N", help="steps your real run trains: compile time is amortised over them (default: 1000)")
    p.add_argument("--precision", help="comma-separated policies the tune may choose from (default: every policy this device runs fast)")
    p.add_argument("--stages", metavar="LIST", help="comma-separated levers to tune: fit, loader, channels_last, precision, compile, fused_step, micro_batch, threads (default: all; fit runs whenever your batch does not fit)")
    p.add_argument("--batch-size", type=positive, metavar="N", help="rows per training batch of a built-in workload or a datasets.Dataset from --data: your global batch (default: the size's; a Dataset's 8)")
    p.add_argument("--accumulate", type=positive, default=1, metavar="K", help="your accumulation: the global batch is K batches (default: 1)")
    p.add_argument("--rounds", type=positive, default=4, help="interleaving rounds of each trial (default: 4)")
    p.add_argument("--chunk", type=positive, default=3, metavar="STEPS", help="timed steps per candidate per round (default: 3)")
    p.add_argument("--guard-steps", type=positive, metavar="N", help="steps each accuracy-guard run trains (default: the workload's steps, at least 30)")
    p.add_argument("--device-memory", type=memory_size, metavar="SIZE", help="memory a step may use, e.g. 24GiB (default: what the device has free)")
    _add_out(p, writes="tune.json, report.md and trials.json (kept as trials complete: the same command with the same --out resumes)")
    p.add_argument("--no-progress", action="store_true", help="no progress on stderr (by default a bar with the time left on a terminal, a line per stage in a log)")
    p.set_defaults(func=_runs("tune"))
