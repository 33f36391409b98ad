"""Which framework a model comes from, recorded in ``Workload.extra`` for advice in the user's terms, and told without
importing any framework: ``import ampkit`` and the workloads layer load none of them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from ampkit.workloads._frameworks import framework_facts, is_datamodule, is_hf_dataset, is_hf_model, is_lightning_module
from ampkit.workloads._user import workload_from

FRAMEWORKS = ("transformers", "lightning", "pytorch_lightning", "datasets", "accelerate")


def test_importing_the_workloads_and_the_tools_python_apis_loads_no_framework() -> None:
    code = (
        "import ampkit, ampkit.workloads, ampkit.bench, ampkit.memory, ampkit.numerics, ampkit.tuning, ampkit.profile, json, sys\n"
        "from ampkit.workloads._framework_inputs import framework_inputs\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout.splitlines()[-1])
    assert [m for m in loaded if m.split(".")[0] in FRAMEWORKS] == []


def test_a_plain_module_has_no_framework_and_no_framework_is_imported_to_say_so() -> None:
    assert framework_facts(nn.Linear(2, 2)) == {}
    assert not any(check(nn.Linear(2, 2)) for check in (is_lightning_module, is_hf_model, is_hf_dataset, is_datamodule))
    workload = workload_from(nn.Linear(4, 2), [(torch.randn(2, 4), torch.tensor([0, 1]))], steps=2, warmup=1)
    assert "framework" not in workload.extra


def test_a_transformers_model_is_recorded_with_its_gradient_checkpointing(hf_folders: dict[str, Path]) -> None:
    from ampkit.workloads._hf_folder import hf_folder, load_hf_model

    model = load_hf_model(hf_folder(f"hf:{hf_folders['weights']}"))
    assert framework_facts(model) == {"framework": "transformers", "supports_gradient_checkpointing": True}
    ids = torch.randint(0, 64, (2, 8))
    workload = workload_from(model, [{"input_ids": ids, "labels": ids}], steps=2, warmup=1)
    assert workload.extra["framework"] == "transformers" and workload.extra["supports_gradient_checkpointing"] is True


def test_a_lightning_module_is_recorded_as_lightning() -> None:
    lightning = pytest.importorskip("lightning.pytorch")

    class Lit(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 2)

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    assert framework_facts(Lit()) == {"framework": "lightning"}
    workload = workload_from(Lit(), [(torch.randn(2, 4), torch.tensor([0, 1]))], steps=2, warmup=1)
    assert workload.extra["framework"] == "lightning" and workload.name == "Lit"
