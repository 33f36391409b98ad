"""``ampkit env``: the versions, devices and per-device policy support of this machine.

Paste its output into bug reports. :func:`collect_env` gathers the facts as plain JSON-ready data; the table
and ``--json`` renderers only format them, so what the two print can never disagree.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .. import __version__
from ..policy import ALIASES, get_policy, policy_names
from ..policy._device import Support, cpu_bf16_native, cpu_fp16_native, cpu_name, cuda_bf16_supported
from ..training._kernel_guards import KNOWN_DEFECTS, torch_affected
from ._parsers import add_env as register  # declared apart: `ampkit --help` imports none of this module

__all__ = ["register", "run", "collect_env", "recommend", "RECOMMEND_ORDER"]

logger = logging.getLogger("ampkit")

RECOMMEND_ORDER: tuple[str, ...] = ("bf16-mixed", "16-mixed", "tf32", "32-true")
"""Policies ``env`` may recommend, best first. All keep fp32 weights, so none can lose small updates;
``32-true`` runs everywhere, so every device gets a recommendation."""


def run(args: argparse.Namespace) -> int:
    """Print the environment as tables, or as JSON with ``--json``."""
    facts = collect_env()
    if args.json:
        # Plain stdout, not rich: rich would wrap long lines and highlight, breaking `| jq`.
        sys.stdout.write(json.dumps(facts, indent=2) + "\n")
    else:
        render_tables(facts)
    return 0


# -- facts ----------------------------------------------------------------------------------------------


def _device_facts() -> list[dict[str, Any]]:
    devices: list[dict[str, Any]] = [
        {
            "device": "cpu",
            "name": cpu_name(),
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "bf16_native": cpu_bf16_native(),
            "fp16_native": cpu_fp16_native(),
        }
    ]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            device = torch.device("cuda", i)
            major, minor = torch.cuda.get_device_capability(device)
            devices.append(
                {
                    "device": str(device),
                    "name": torch.cuda.get_device_name(device),
                    "capability": f"{major}.{minor}",
                    "total_memory_bytes": int(torch.cuda.get_device_properties(device).total_memory),
                    "bf16_native": cuda_bf16_supported(device),
                    # Every CUDA device ampkit targets has fp16 arithmetic; tensor cores need sm70+.
                    "fp16_native": (major, minor) >= (7, 0),
                }
            )
    return devices


def _support_dict(s: Support) -> dict[str, Any]:
    return {"supported": s.supported, "fast": s.fast, "reason": s.reason}


def recommend(device: torch.device | str) -> str:
    """The first policy of :data:`RECOMMEND_ORDER` that runs fast on ``device`` (``32-true`` at worst)."""
    for name in RECOMMEND_ORDER:
        policy = get_policy(name)
        s = policy.support(device)
        # Guard the fp32-weights promise in case someone reorders RECOMMEND_ORDER with a 16-bit policy.
        if s.supported and s.fast and policy.param_dtype == torch.float32:
            return name
    return "32-true"


def _kernel_guards(devices: list[str]) -> list[dict[str, Any]]:
    """Every known kernel defect, with the devices of this machine where its guard is active (empty: not applicable)."""
    out = []
    for d in KNOWN_DEFECTS:
        affected = torch_affected(d)
        active = [dev for dev in devices if affected and (d.devices is None or torch.device(dev).type in d.devices)]
        out.append(
            {
                "name": d.name,
                "condition": d.condition(),
                "torch_versions": d.torch_versions,
                "active_on": active,
                "description": d.description,
                "upstream": d.upstream,
                "workaround": d.workaround,
            }
        )
    return out


def collect_env() -> dict[str, Any]:
    """Gather versions, devices, per-device policy support, aliases and recommendations as JSON-ready data.

    >>> facts = collect_env()
    >>> facts["devices"][0]["device"], "bf16-mixed" in [p["name"] for p in facts["policies"]]
    ('cpu', True)
    """
    devices = _device_facts()
    names = [d["device"] for d in devices]
    policies = []
    for name in policy_names():
        policy = get_policy(name)
        policies.append(
            {
                "name": name,
                "description": policy.description,
                "support": {dev: _support_dict(policy.support(dev)) for dev in names},
            }
        )
    return {
        "ampkit": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cuda": {
            "available": torch.cuda.is_available(),
            "version": torch.version.cuda,  # None on CPU-only torch builds
            "device_count": len(names) - 1,
        },
        "devices": devices,
        "policies": policies,
        "aliases": dict(ALIASES),
        "recommended": {dev: recommend(dev) for dev in names},
        "kernel_guards": _kernel_guards(names),
    }


# -- rendering ------------------------------------------------------------------------------------------


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def _status(support: dict[str, Any]) -> Text:
    # Words, not symbols or colour alone: the output must read the same in a CI log without colour.
    if not support["supported"]:
        return Text("unsupported", style="red")
    if support["fast"]:
        return Text("supported, fast", style="green")
    return Text("supported, slow", style="yellow")


def _summary_table(facts: dict[str, Any]) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    cpu = facts["devices"][0]
    cuda = facts["cuda"]
    rows = [
        ("ampkit", facts["ampkit"]),
        ("torch", facts["torch"] + (f" (CUDA {cuda['version']})" if cuda["version"] else " (CPU build)")),
        ("Python", facts["python"]),
        ("Platform", facts["platform"]),
        ("CPU", cpu["name"]),
        ("CPU cores", f"{cpu['cores']} logical; torch uses {cpu['torch_threads']} threads"),
        ("CPU bf16 native", _yes_no(cpu["bf16_native"]) + (" (AMX-BF16 or AVX512-BF16)" if cpu["bf16_native"] else "")),
        ("CPU fp16 native", _yes_no(cpu["fp16_native"]) + (" (AMX-FP16)" if cpu["fp16_native"] else "")),
        ("CUDA", f"available, {cuda['device_count']} device(s)" if cuda["available"] else "not available"),
    ]
    for dev in facts["devices"][1:]:
        gib = dev["total_memory_bytes"] / 2**30
        rows.append(
            (dev["device"], f"{dev['name']}, compute capability {dev['capability']}, {gib:.1f} GiB, bf16 {_yes_no(dev['bf16_native'])}")
        )
    for key, value in rows:
        table.add_row(key, Text(str(value)))  # Text, not markup: CPU names may contain "[...]"
    return table


def _policy_table(facts: dict[str, Any]) -> Table:
    table = Table(title="Precision policies", title_justify="left", show_lines=True)
    # Names never wrap, so they stay greppable in narrow, non-TTY output.
    table.add_column("Policy", style="bold", no_wrap=True)
    table.add_column("Description", ratio=2)
    devices = [d["device"] for d in facts["devices"]]
    for dev in devices:
        table.add_column(dev, ratio=3)
    for policy in facts["policies"]:
        cells = []
        for dev in devices:
            s = policy["support"][dev]
            cell = _status(s)
            cell.append("\n")
            cell.append(s["reason"], style="dim")
            cells.append(cell)
        table.add_row(policy["name"], Text(policy["description"]), *cells)
    return table


def _alias_table(facts: dict[str, Any]) -> Table:
    table = Table(title="Aliases", title_justify="left")
    table.add_column("Alias", no_wrap=True)
    table.add_column("Policy", no_wrap=True)
    for alias, name in facts["aliases"].items():
        table.add_row(alias, name)
    return table


def _guard_table(facts: dict[str, Any]) -> Table:
    table = Table(title=f"Kernel guards (torch {facts['torch']})", title_justify="left", show_lines=True)
    table.add_column("Guard: when", ratio=2)
    table.add_column("Status", no_wrap=True)  # greppable in narrow, non-TTY output
    table.add_column("Defect; what ampkit does", ratio=3)
    for g in facts["kernel_guards"]:
        versions = "every torch release so far" if g["torch_versions"] == "*" else f"torch {g['torch_versions']}"
        guard = Text(g["name"], style="bold")
        guard.append(f"\n{g['condition']}; {versions}")
        status = Text("active on " + ", ".join(g["active_on"]), style="yellow") if g["active_on"] else Text("not applicable", style="dim")
        detail = Text(f"{g['description']} ({g['upstream']}).\n")
        detail.append(f"ampkit: {g['workaround']}.", style="dim")
        table.add_row(guard, status, detail)
    return table


def _recommendations(facts: dict[str, Any]) -> list[Text]:
    support = {p["name"]: p["support"] for p in facts["policies"]}
    lines = []
    for dev, name in facts["recommended"].items():
        line = Text(f"recommended on {dev}: ")
        line.append(name, style="bold green")
        line.append(f" ({support[name][dev]['reason']})")
        lines.append(line)
    return lines


def render_tables(facts: dict[str, Any], console: Console | None = None) -> None:
    """Print ``facts`` from :func:`collect_env` as human-readable tables."""
    # A fresh Console lets rich decide per run: colour and full width on a terminal, plain text in CI logs.
    console = console or Console(highlight=False)
    console.print(_summary_table(facts))
    console.print()
    console.print(_policy_table(facts))
    console.print()
    console.print(_alias_table(facts))
    console.print()
    console.print(_guard_table(facts))
    console.print()
    for line in _recommendations(facts):
        # soft_wrap: one logical line per device even at 80 columns, so `grep recommended` finds it whole.
        console.print(line, soft_wrap=True)
