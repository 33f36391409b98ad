"""Which line a host sync is blamed on when the stack holds no code of the user's loop: the model's forward, never
ampkit's launcher (``bin/ampkit:8 sys.exit(main())``), a test runner calling ``main()`` or torch's module call.
The stacks are written out as :func:`traceback.extract_stack` gives them (outermost first), with the real
directories of this interpreter, ampkit and torch, so the decision is tested without building a Hugging Face model."""

from __future__ import annotations

import os
import sysconfig
import traceback

import pytest
import torch

import ampkit
from ampkit.profile._syncs import _user_frame

AMPKIT = os.path.dirname(ampkit.__file__)
TORCH = os.path.dirname(torch.__file__)
PACKAGES = sysconfig.get_paths()["purelib"]
SCRIPTS = sysconfig.get_paths()["scripts"]
GPT2 = os.path.join(PACKAGES, "transformers", "models", "gpt2", "modeling_gpt2.py")
MASKS = os.path.join(PACKAGES, "transformers", "masking_utils.py")
GENERIC = os.path.join(PACKAGES, "transformers", "utils", "generic.py")


def _frame(filename: str, lineno: int, name: str, line: str) -> traceback.FrameSummary:
    return traceback.FrameSummary(filename, lineno, name, line=line)


LAUNCHER = [_frame(os.path.join(SCRIPTS, "ampkit"), 8, "<module>", "sys.exit(main())")]
PYTEST = [
    _frame(os.path.join(PACKAGES, "_pytest", "python.py"), 157, "pytest_pyfunc_call", "result = testfunction(**testargs)"),
    _frame("/home/me/tests/test_cli.py", 12, "test_profile", "assert main(argv) == 0"),
]
COMMAND = [
    _frame(os.path.join(AMPKIT, "cli", "_main.py"), 90, "main", "return args.func(args)"),
    _frame(os.path.join(AMPKIT, "profile", "_run.py"), 150, "micro_step", "loss = batch_loss(model, batch, workload.loss_fn)"),
    _frame(os.path.join(AMPKIT, "_util", "model_io.py"), 60, "batch_loss", "output = model(**batch)"),
]
FORWARD = [  # the engine's wrapper and torch's module calls around GPT-2's two forwards, the read in its mask helper
    _frame(os.path.join(AMPKIT, "training", "_engine.py"), 300, "forward", "return self._forward(*args, **kwargs)"),
    _frame(os.path.join(TORCH, "nn", "modules", "module.py"), 1780, "_call_impl", "return forward_call(*args, **kwargs)"),
    _frame(GENERIC, 943, "wrapper", "output = func(self, *args, **kwargs)"),  # transformers' decorator on the forward
    _frame(GPT2, 1070, "forward", "transformer_outputs = self.transformer(input_ids, attention_mask=attention_mask)"),
    _frame(os.path.join(TORCH, "nn", "modules", "module.py"), 1780, "_call_impl", "return forward_call(*args, **kwargs)"),
    _frame(GPT2, 880, "forward", "causal_mask = create_causal_mask(config=self.config, input_embeds=inputs_embeds)"),
    _frame(MASKS, 321, "sdpa_mask", "if padding_mask.all():"),
]


@pytest.mark.parametrize("started", [LAUNCHER, PYTEST], ids=["console script", "a test calling main()"])
def test_a_read_in_a_packaged_model_run_by_a_command_is_blamed_on_the_models_forward(started: list[traceback.FrameSummary]) -> None:
    site = _user_frame(stack=[*started, *COMMAND, *FORWARD])
    assert site is not None
    where, code, via, via_code = site
    assert where == f"{GPT2}:1070 in forward" and code.startswith("transformer_outputs = self.transformer(")
    assert via == f"{MASKS}:321 in sdpa_mask" and via_code == "if padding_mask.all():"


def test_a_read_in_the_models_own_forward_is_that_line() -> None:
    site = _user_frame(stack=[*LAUNCHER, *COMMAND, *FORWARD[:2], _frame(GPT2, 1075, "forward", "if labels.max() > 0:")])
    assert site == (f"{GPT2}:1075 in forward", "if labels.max() > 0:", "", "")


def test_the_users_own_loop_line_still_wins() -> None:
    # The twin: a loop of the user's calling the model through the engine is blamed at its line, the read beneath it.
    loop = [_frame("/home/me/train.py", 42, "train", "out = model(**batch)")]
    site = _user_frame(stack=[_frame("/home/me/train.py", 60, "<module>", "train()"), *loop, *FORWARD])
    assert site is not None and site[0] == "/home/me/train.py:42 in train" and site[2] == f"{MASKS}:321 in sdpa_mask"


def test_a_read_of_ampkits_or_torchs_own_is_nobodys() -> None:
    assert _user_frame(stack=[*LAUNCHER, *COMMAND, _frame(os.path.join(TORCH, "optim", "adam.py"), 200, "step", "step = _get_value(t)")]) is None
