"""ScalerConfig: validation names the offending field, dict round trip, defaults match torch's GradScaler."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ampkit.scaling import ScalerConfig

INF = float("inf")
NAN = float("nan")


def test_defaults_match_torch_gradscaler():
    # Control: torch's own GradScaler defaults; treatment: ours. Only floor and ceiling are ampkit's own.
    control = torch.amp.GradScaler("cpu")
    cfg = ScalerConfig()
    assert cfg.init_scale == control.get_scale()
    assert cfg.growth_factor == control.get_growth_factor()
    assert cfg.backoff_factor == control.get_backoff_factor()
    assert cfg.growth_interval == control.get_growth_interval()
    assert cfg.hysteresis == 1
    assert cfg.consecutive_hysteresis is False


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"init_scale": 0.0}, "init_scale"),
        ({"init_scale": -1.0}, "init_scale"),
        ({"init_scale": INF}, "init_scale"),
        ({"init_scale": NAN}, "init_scale"),
        ({"growth_factor": 1.0}, "growth_factor"),
        ({"growth_factor": 0.5}, "growth_factor"),
        ({"growth_factor": NAN}, "growth_factor"),
        ({"backoff_factor": 0.0}, "backoff_factor"),
        ({"backoff_factor": 1.0}, "backoff_factor"),
        ({"backoff_factor": -0.5}, "backoff_factor"),
        ({"backoff_factor": 1.5}, "backoff_factor"),
        ({"growth_interval": 0}, "growth_interval"),
        ({"growth_interval": -3}, "growth_interval"),
        ({"growth_interval": 2.0}, "growth_interval"),
        ({"hysteresis": 0}, "hysteresis"),
        ({"hysteresis": -1}, "hysteresis"),
        ({"hysteresis": 1.5}, "hysteresis"),
        ({"hysteresis": 2.0}, "hysteresis"),
        ({"min_scale": 0.0}, "min_scale"),
        ({"min_scale": -1.0}, "min_scale"),
        ({"init_scale": 4.0, "min_scale": 8.0}, "min_scale"),
        ({"init_scale": 4.0, "max_scale": 2.0}, "max_scale"),
        ({"max_scale": INF}, "max_scale"),
        ({"max_scale": 1e39}, "max_scale"),
        ({"max_consecutive_skips": 0}, "max_consecutive_skips"),
        ({"on_collapse": "explode"}, "on_collapse"),
    ],
)
def test_invalid_field_raises_naming_it(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ScalerConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"init_scale": 1.0, "min_scale": 1.0, "max_scale": 1.0},  # all three bounds may coincide
        {"growth_factor": 1.0001, "backoff_factor": 0.9999},
        {"growth_interval": 1, "hysteresis": 1, "max_consecutive_skips": 1},
        {"on_collapse": "warn"},
    ],
)
def test_boundary_values_are_accepted(kwargs):
    cfg = ScalerConfig(**kwargs)
    for name, value in kwargs.items():
        assert getattr(cfg, name) == value


NON_DEFAULT = dict(
    init_scale=2.0**8,
    growth_factor=4.0,
    backoff_factor=0.25,
    growth_interval=7,
    hysteresis=3,
    consecutive_hysteresis=True,
    min_scale=2.0**-4,
    max_scale=2.0**20,
    max_consecutive_skips=9,
    on_collapse="warn",
)


def test_to_dict_is_plain_and_complete():
    cfg = ScalerConfig(**NON_DEFAULT)
    d = cfg.to_dict()
    assert type(d) is dict
    assert d == NON_DEFAULT
    assert set(d) == {f.name for f in dataclasses.fields(ScalerConfig)}


@pytest.mark.parametrize("kwargs", [{}, NON_DEFAULT])
def test_dict_round_trip(kwargs):
    cfg = ScalerConfig(**kwargs)
    again = ScalerConfig.from_dict(cfg.to_dict())
    assert again == cfg
    assert again.to_dict() == cfg.to_dict()


def test_from_dict_unknown_key_raises_naming_it():
    data = ScalerConfig().to_dict() | {"loss_scale": 128.0}
    with pytest.raises(ValueError, match="loss_scale"):
        ScalerConfig.from_dict(data)


def test_from_dict_validates():
    data = ScalerConfig().to_dict() | {"hysteresis": 0}
    with pytest.raises(ValueError, match="hysteresis"):
        ScalerConfig.from_dict(data)


def test_config_is_frozen():
    cfg = ScalerConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.hysteresis = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"init_scale": "big"}, "init_scale must be a number, got str 'big'"),
        ({"growth_factor": None}, "growth_factor must be a number, got NoneType"),
        ({"min_scale": True}, "min_scale must be a number, got bool"),
        ({"growth_interval": 2.5}, "growth_interval must be an int, got float 2.5"),
        ({"hysteresis": "2"}, "hysteresis must be an int, got str '2'"),
        ({"consecutive_hysteresis": "yes"}, "consecutive_hysteresis must be True or False"),
    ],
)
def test_wrong_types_are_named_not_python_errors(kwargs, message):
    with pytest.raises(ValueError, match="^ScalerConfig: ") as info:
        ScalerConfig(**kwargs)
    assert message in str(info.value)
