"""A Lightning run stopped at a checkpoint and resumed with ``Trainer.fit(ckpt_path=...)`` continues as the run that
was not stopped, bit for bit: the plugin's state (loss scale, fp32 masters, counters) travels in Lightning's own
checkpoint. The negative control drops that state from the checkpoint and shows the resumed run then differs."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch

from ampkit.lightning import AmpkitPrecision

from .conftest import Classifier, assert_same_weights, fit


def _resume(policy: str, tmp_path: Path, *, drop_state: bool = False) -> tuple[Classifier, Classifier, dict]:
    """(uninterrupted, resumed, checkpoint): two epochs at once, and one epoch + a resume for the second."""
    # Under loss scaling an overflow in the first epoch: the scale the checkpoint carries is not the start's.
    poison = {2} if policy.startswith("16") else set()
    whole = Classifier(poison=poison)
    fit(whole, epochs=2, plugins=[AmpkitPrecision(policy)])

    first = Classifier(poison=poison)
    trainer = fit(first, epochs=1, plugins=[AmpkitPrecision(policy)])
    path = tmp_path / "epoch1.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=True)  # the plugin's state loads safely
    if drop_state:
        del checkpoint["AmpkitPrecision"]
        torch.save(checkpoint, path)
    resumed = Classifier(poison=poison)
    L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, plugins=[AmpkitPrecision(policy)]).fit(resumed, ckpt_path=path)
    return whole, resumed, checkpoint


@pytest.mark.parametrize("policy", ["16-mixed", "bf16-true-masters", "16-true-masters"])
def test_a_resumed_fit_continues_the_uninterrupted_run_bit_for_bit(policy: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    whole, resumed, checkpoint = _resume(policy, tmp_path)
    second_epoch = whole.losses[len(whole.losses) // 2 :]
    assert resumed.losses == second_epoch
    assert_same_weights(resumed.net, whole.net)
    state = checkpoint["AmpkitPrecision"]
    assert state["policy"] == policy and state["steps"] == len(second_epoch)
    assert (state["masters"] is not None) == ("masters" in policy)
    assert (state["scaler"] is not None) == policy.startswith("16")
    assert "holds no AmpkitPrecision state" not in caplog.text


def test_without_the_plugins_state_the_resumed_run_differs_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The control that shows the test above can fail: the 16-bit weights alone lose the fp32 masters."""
    whole, resumed, _ = _resume("bf16-true-masters", tmp_path, drop_state=True)
    assert "holds no AmpkitPrecision state" in caplog.text
    assert all(torch.isfinite(torch.tensor(resumed.losses)))
    assert resumed.losses != whole.losses[len(whole.losses) // 2 :]
