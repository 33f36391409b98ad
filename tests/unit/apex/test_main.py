"""python -m ampkit.apex SCRIPT: an unchanged Apex script runs, with its own argv and directory on sys.path."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from ampkit.apex.__main__ import main

LEGACY = textwrap.dedent(
    """
    import sys
    import torch
    from apex import amp
    from helper import SIZE  # the script's own directory is importable, as with `python script.py`

    model = torch.nn.Linear(SIZE, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level=sys.argv[1], verbosity=0)
    for _ in range(3):
        loss = model(torch.ones(2, SIZE)).pow(2).mean()
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
    print("argv", sys.argv[1:], "name", __name__, "dtype", model.weight.dtype)
    """
)


def test_runs_a_legacy_script_unchanged(tmp_path):
    (tmp_path / "train.py").write_text(LEGACY)
    (tmp_path / "helper.py").write_text("SIZE = 3\n")
    out = subprocess.run(
        [sys.executable, "-m", "ampkit.apex", str(tmp_path / "train.py"), "O2"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "argv ['O2'] name __main__ dtype torch.bfloat16" in out.stdout


def test_half_dtype_option_and_module_mode(tmp_path, monkeypatch):
    (tmp_path / "legacy_train.py").write_text(LEGACY)
    (tmp_path / "helper.py").write_text("SIZE = 2\n")
    out = subprocess.run(
        [sys.executable, "-m", "ampkit.apex", "--half-dtype", "float16", "-m", "legacy_train", "O3"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "dtype torch.float16" in out.stdout


def test_missing_script_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["no_such_script.py"])
    assert exc.value.code == 2
    assert "no such script: no_such_script.py" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([])
