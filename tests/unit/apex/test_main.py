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
        [sys.executable, "-m", "ampkit.apex", str(tmp_path / "train.py"), "O2"], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "argv ['O2'] name __main__ dtype torch.bfloat16" in out.stdout


def test_everything_after_the_script_is_the_scripts_own(tmp_path, monkeypatch, capsys):
    # docs/guides/apex.md: in `python -m ampkit.apex train.py --opt-level O2`, --opt-level is train.py's flag, passed unchanged,
    # even where it looks like the runner's own (--force, -m).
    script = tmp_path / "flags.py"
    script.write_text("import sys\nprint(sys.argv[1:])\n")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    main([str(script), "--opt-level", "O2", "--force", "-m", "x"])
    assert capsys.readouterr().out == "['--opt-level', 'O2', '--force', '-m', 'x']\n"


def test_half_dtype_option_and_module_mode(tmp_path, monkeypatch):
    (tmp_path / "legacy_train.py").write_text(LEGACY)
    (tmp_path / "helper.py").write_text("SIZE = 2\n")
    out = subprocess.run(
        [sys.executable, "-m", "ampkit.apex", "--half-dtype", "float16", "-m", "legacy_train", "O3"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
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


# A real Apex vendored beside the script: it has apex.optimizers but, like Apex since 2025, no apex.amp.
WHICH_APEX = textwrap.dedent(
    """
    import apex
    import apex.optimizers
    import apex.contrib
    from apex import amp

    print("apex", "vendored" if getattr(apex, "VENDORED", False) else apex.__name__)
    print("optimizers", getattr(apex.optimizers, "FUSED", apex.optimizers.__name__))
    print("amp", amp.initialize.__module__)
    print("contrib", apex.contrib.WHICH)
    """
)


@pytest.fixture
def vendored_project(tmp_path):
    proj = tmp_path / "proj"
    (proj / "apex" / "optimizers").mkdir(parents=True)
    (proj / "apex" / "__init__.py").write_text("VENDORED = True\n")
    (proj / "apex" / "optimizers" / "__init__.py").write_text("FUSED = 'vendored FusedAdam'\n")
    (proj / "apex" / "contrib").mkdir()
    (proj / "apex" / "contrib" / "__init__.py").write_text("WHICH = 'vendored'\n")
    (proj / "train.py").write_text(WHICH_APEX)
    return proj


# --force: ampkit's modules in front (optimizers), the real package and its other modules (contrib) kept.
@pytest.mark.parametrize(("force", "expected"), [
    ([], ["apex vendored", "optimizers vendored FusedAdam", "amp ampkit.apex._initialize", "contrib vendored"]),
    (["--force"], ["apex vendored", "optimizers ampkit.apex.optimizers", "amp ampkit.apex._initialize", "contrib vendored"]),
])
def test_a_real_apex_beside_the_script_is_kept_when_run_from_elsewhere(vendored_project, force, expected):
    # Run from the project's parent: only the script's own directory puts the vendored apex on sys.path.
    out = subprocess.run(
        [sys.executable, "-m", "ampkit.apex", *force, "proj/train.py"],
        capture_output=True, text=True, timeout=120, cwd=vendored_project.parent, check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:4] == expected
    if not force:  # ampkit fills in apex.amp only, and says so
        assert "has no apex.amp; ampkit.apex supplies it" in out.stderr


def test_module_mode_puts_the_current_directory_first(vendored_project, monkeypatch, capsys):
    # As `python -m` does; in-process the caller's sys.path need not hold the current directory.
    monkeypatch.chdir(vendored_project)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(vendored_project))])
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.delitem(sys.modules, "apex", raising=False)
    try:
        main(["-m", "train"])
    finally:
        for name in [n for n in sys.modules if n == "apex" or n.startswith("apex.")]:
            del sys.modules[name]
    assert capsys.readouterr().out.split("\n")[:3] == ["apex vendored", "optimizers vendored FusedAdam", "amp ampkit.apex._initialize"]


def test_a_real_apex_that_fails_to_import_names_force_which_runs_the_script(tmp_path):
    # A real Apex whose CUDA extensions were never built, beside the script: its __init__ raises ImportError.
    (tmp_path / "apex").mkdir()
    (tmp_path / "apex" / "__init__.py").write_text("import amp_C\n")
    (tmp_path / "train.py").write_text(LEGACY)
    (tmp_path / "helper.py").write_text("SIZE = 3\n")
    script = str(tmp_path / "train.py")

    plain = subprocess.run([sys.executable, "-m", "ampkit.apex", script, "O2"], capture_output=True, text=True, timeout=120, check=False)
    assert plain.returncode != 0 and "argv" not in plain.stdout
    hint = plain.stderr.strip().splitlines()[-1]  # the last line the user reads names the way out
    assert hint.startswith("ImportError: the real apex at") and "python -m ampkit.apex --force" in hint
    assert "ModuleNotFoundError: No module named 'amp_C'" in plain.stderr  # the original error stays visible

    forced = subprocess.run([sys.executable, "-m", "ampkit.apex", "--force", script, "O2"], capture_output=True, text=True, timeout=120, check=False)
    assert forced.returncode == 0, forced.stderr
    assert "argv ['O2'] name __main__ dtype torch.bfloat16" in forced.stdout  # trained on ampkit's amp
    assert "stands in for the package itself" in forced.stderr
