"""keep_fp32 lists said in module types where a type covers them: every module of the type listed, none left healthy.
The type keeps exactly the modules the names kept (the Engine matches types with isinstance), and the paste trains."""

from __future__ import annotations

import torch
from torch import nn

from ampkit import Engine
from ampkit.numerics import diagnose
from ampkit.numerics._keep_types import collapse_to_types
from ampkit.policy._islands import is_fp32_island


def _convnet() -> nn.Module:
    torch.manual_seed(0)
    block = lambda c: [nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU()]
    return nn.Sequential(*block(3), *block(3), *block(3), nn.Flatten(), nn.Linear(3 * 4 * 4, 2))


def _islands(model: nn.Module, keep: list) -> set[str]:  # type: ignore[type-arg]
    engine = Engine("bf16-mixed", keep_fp32=keep)
    model, _ = engine.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return {n for n, m in model.named_modules() if is_fp32_island(m)}


def test_every_module_of_a_type_listed_becomes_the_type_and_keeps_the_same_modules() -> None:
    model = _convnet()
    norms = [n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(norms) == 3
    keep = collapse_to_types(model, [*norms, "10"])  # "10": the head's Linear, the only one of its type: kept by name
    assert keep == [nn.BatchNorm2d, "10"]
    assert _islands(_convnet(), keep) == _islands(_convnet(), [*norms, "10"]) == {*norms, "10"}


def test_a_type_with_a_healthy_module_stays_names() -> None:
    model = _convnet()
    norms = [n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    assert collapse_to_types(model, norms[:2]) == norms[:2]


class _TwoAmplifiers(nn.Module):
    """Both Linears' outputs reach ~1e5 (inf in fp16); the head is a Conv1d over the features, another type."""

    def __init__(self) -> None:
        super().__init__()
        self.amp1, self.norm1 = nn.Linear(16, 32), nn.LayerNorm(32)
        self.amp2, self.norm2 = nn.Linear(32, 32), nn.LayerNorm(32)
        self.head = nn.Conv1d(1, 4, 32)
        with torch.no_grad():
            self.amp1.weight.mul_(2e5)
            self.amp2.weight.mul_(2e5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm2(self.amp2(self.norm1(self.amp1(x))))
        return self.head(h.unsqueeze(1)).squeeze(-1)


def test_the_doctor_pastes_the_type_and_the_paste_trains_every_step() -> None:
    torch.manual_seed(0)
    model = _TwoAmplifiers()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)) for _ in range(3)]
    d = diagnose(model, batches, steps=2, target="16-mixed", update_steps=0, fp8_recipe=None)
    assert d.keep_fp32 == ["amp1", "amp2"] and d.to_dict()["keep_fp32"] == ["amp1", "amp2"]  # doctor.json: the names
    assert "keep_fp32=[nn.Linear]" in d.engine_code() and d.engine_kwargs()["keep_fp32"] == [nn.Linear]
    engine = Engine(**d.engine_kwargs())
    work, _ = engine.setup(model, torch.optim.Adam(model.parameters(), lr=1e-3))
    for x, y in batches:
        with engine.autocast():
            loss = nn.functional.cross_entropy(work(x).float(), y)
        engine.backward(loss)
        engine.step()
    assert engine.skipped_steps == 0
