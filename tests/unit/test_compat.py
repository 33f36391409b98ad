"""ampkit._compat: each shim on the running torch, and each fallback branch taken by pretending to be an older one."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

from ampkit import _compat


def test_the_running_torch_is_supported_and_the_floor_matches_pyproject() -> None:
    assert _compat.TORCH_VERSION == torch.__version__
    assert _compat.TORCH_VERSION >= _compat.OLDEST_TORCH
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    assert f'"torch>={_compat.OLDEST_TORCH}"' in pyproject, "OLDEST_TORCH and pyproject.toml's torch floor must agree"


@pytest.mark.parametrize(
    "name, module",
    [
        ("DTensor", "torch.distributed.tensor"),
        ("fully_shard", "torch.distributed.fsdp"),
        ("FSDPModule", "torch.distributed.fsdp"),
        ("MixedPrecisionPolicy", "torch.distributed.fsdp"),
    ],
)
def test_lazy_distributed_names_come_from_their_public_modules(name: str, module: str) -> None:
    assert getattr(_compat, name) is getattr(importlib.import_module(module), name)


def test_lazy_names_fail_like_attributes() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        _compat.no_such_name  # noqa: B018


def test_dcp_helpers_rebuild_a_nested_state_dict() -> None:
    flat, mapping = _compat.flatten_state_dict({"a": {"b": torch.ones(1)}})
    rebuilt: dict[str, object] = {}
    for key, value in flat.items():
        _compat.set_element(rebuilt, mapping[key], value)
    assert torch.equal(rebuilt["a"]["b"], torch.ones(1))  # type: ignore[index]


def test_pytree_and_dispatch_are_torch_own() -> None:
    from torch.utils import _pytree

    assert _compat.tree_map is _pytree.tree_map and _compat.tree_flatten is _pytree.tree_flatten
    with _compat.FakeTensorMode() as mode:
        fake = torch.empty(3)
    assert isinstance(fake, _compat.FakeTensor) and fake.fake_mode is mode
    assert issubclass(type(mode), _compat.TorchDispatchMode)
    assert _compat.current_function_modes() == []


def test_amp_kernels_match_torch_gradscaler_ops() -> None:
    grads, found, inv = [torch.tensor([2.0, float("inf")])], torch.zeros(1), torch.full((1,), 0.5)
    _compat.amp_non_finite_check_and_unscale_(grads, found, inv)
    assert found.item() == 1.0 and grads[0][0].item() == 1.0
    scale, tracker = torch.full((1,), 8.0), torch.zeros(1, dtype=torch.int32)
    _compat.amp_update_scale_(scale, tracker, found, 2.0, 0.5, 100)
    assert scale.item() == 4.0


def test_autograd_sequence_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.ones(1, requires_grad=True)
    before = _compat.autograd_sequence_nr()
    y = x * 2
    assert before is not None and _compat.node_sequence_nr(y.grad_fn) is not None
    assert _compat.node_sequence_nr(y.grad_fn) >= before  # type: ignore[operator]
    assert _compat.node_sequence_nr(x.grad_fn) is None  # a leaf has no node
    monkeypatch.delattr(torch.autograd, "_get_sequence_nr")
    assert _compat.autograd_sequence_nr() is None


def test_cpu_isa_probe_says_none_where_torch_cannot_tell(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert _compat.cpu_isa_probe("amx_bf16") is True
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    assert _compat.cpu_isa_probe("amx_bf16") is None  # torch 2.4 has no such probe


def test_per_backend_fp32_precision_needs_both_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.cudnn, "conv", None, raising=False)
    assert _compat.per_backend_fp32_precision() is False  # torch < 2.9


def test_cuda_tf32_settings_are_read_without_the_legacy_getters_that_raise() -> None:
    # torch's defaults: cuDNN convolutions may run fp32 in TF32, matmuls may not (what 32-true's MFU is held to).
    assert _compat.cuda_allows_tf32("conv") and not _compat.cuda_allows_tf32("matmul")
    if not _compat.per_backend_fp32_precision():
        pytest.skip("torch < 2.9 has only the legacy flags: nothing to resolve")
    matmul, before = torch.backends.cuda.matmul, torch.backends.cuda.matmul.fp32_precision
    try:
        matmul.fp32_precision = "tf32"  # the new API; the legacy getter would now raise on reading allow_tf32
        assert _compat.cuda_allows_tf32("matmul")
        matmul.fp32_precision = "none"  # defers to the global setting
        assert _compat.cuda_allows_tf32("matmul") == (torch.backends.fp32_precision == "tf32")
    finally:
        matmul.fp32_precision = before
    with pytest.raises(ValueError, match="'matmul' or 'conv'"):
        _compat.cuda_allows_tf32("attention")


def test_step_supports_amp_scaling_round_trip() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1, fused=True)
    assert _compat.step_supports_amp_scaling(opt) is True
    _compat.set_step_supports_amp_scaling(opt, False)
    assert _compat.step_supports_amp_scaling(opt) is False
    assert "cuda" in _compat.capturable_supported_devices()


def test_dtensor_caches_clear_without_dtensor_and_skip_missing_ones(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    _compat.DTensor  # noqa: B018  # load DTensor, as a sharded run does
    assert "torch.distributed.tensor" in sys.modules
    monkeypatch.setattr(_compat._distributed, "_DTENSOR_CACHES", (*_compat._distributed._DTENSOR_CACHES, ("torch.distributed.tensor", "no_such_cache", None)))
    with caplog.at_level("DEBUG", logger="ampkit"):
        _compat.clear_dtensor_caches()
    assert "no DTensor cache torch.distributed.tensor.no_such_cache" in caplog.text


def test_clear_mesh_process_groups() -> None:
    class Mesh:
        def __init__(self) -> None:
            self._pg_registry = {"g": object()}

    mesh = Mesh()
    assert _compat.clear_mesh_process_groups(mesh) is True and mesh._pg_registry == {}
    assert _compat.clear_mesh_process_groups(mesh) is False


@pytest.mark.parametrize("private_method", [True, False], ids=["torch>=2.8", "torch 2.7"])
def test_dcp_metadata_path_is_the_directorys_metadata_file(tmp_path: Path, private_method: bool) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    class Reader(FileSystemReader):
        pass

    if not private_method:
        Reader._get_metadata_path = None  # type: ignore[assignment,method-assign]  # what a torch without it looks like
    elif not hasattr(FileSystemReader, "_get_metadata_path"):
        pytest.skip(f"torch {torch.__version__} has no FileSystemReader._get_metadata_path")
    assert Path(_compat.dcp_metadata_path(Reader(tmp_path))) == tmp_path / ".metadata"


def test_fsdp_is_refused_on_the_cpu_only_where_gloo_cannot_average(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_compat._distributed, "GLOO_REDUCE_SCATTER_AVERAGES", False)
    problem = _compat.fsdp_problem("cpu", 2)
    assert problem is not None and "2 times too large" in problem and "strategy='ddp'" in problem
    assert _compat.fsdp_problem("cpu", 1) is None  # one rank: the average is the sum
    assert _compat.fsdp_problem("cuda", 2) is None  # NCCL averages
    monkeypatch.setattr(_compat._distributed, "GLOO_REDUCE_SCATTER_AVERAGES", True)
    assert _compat.fsdp_problem("cpu", 2) is None


def test_the_loop_reordering_flag_says_what_inductors_source_does() -> None:
    # Up to 2.11 the first loop over a fused node's parts asserts each is a SchedulerNode (a foreach kernel's may
    # be fused nodes); 2.12 returns False there (pytorch/pytorch#176849). Read from the running torch's source, so
    # a release that changes it, either way, fails here rather than on a GPU.
    import inspect

    from torch._inductor.scheduler import FusedSchedulerNode

    source = inspect.getsource(FusedSchedulerNode.reorder_loops_by_dep_pair)
    first_loop = source[source.index("for snode in self.snodes"):source.index("new_order = None")]
    assert ("assert isinstance(snode, SchedulerNode)" in first_loop) == _compat.INDUCTOR_FOREACH_REORDER_ASSERTS
    assert _compat.INDUCTOR_FOREACH_REORDER_ASSERTS == (_compat.TORCH_VERSION < "2.12")
    want = {"loop_ordering_after_fusion": False} if _compat.INDUCTOR_FOREACH_REORDER_ASSERTS else {}
    assert _compat.foreach_region_inductor_config() == want


def test_the_loop_reordering_switch_is_an_inductor_option_of_this_torch() -> None:
    # torch.compile checks each option's name against inductor's config when it is called: a release that renamed
    # the switch would fail every fused step's compile, here it fails at once.
    kwargs = _compat.with_inductor_config({}, _compat.foreach_region_inductor_config(asserts=True))
    torch.compile(lambda x: x + 1, **kwargs)
    with pytest.raises(RuntimeError, match="no_such_switch"):
        torch.compile(lambda x: x + 1, **_compat.with_inductor_config({}, {"no_such_switch": False}))
    # A mode and options together stay the error torch.compile makes of them, whatever the region needs.
    both = {"mode": "max-autotune", "options": {"max_autotune": True}}
    assert _compat.with_inductor_config(both, {"loop_ordering_after_fusion": False}) == both
    with pytest.raises(RuntimeError, match="Either mode or options"):
        torch.compile(lambda x: x + 1, **both)


def test_compiler_error_tells_the_compilers_errors_from_the_programs() -> None:
    def failing(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> object:
        raise ValueError("the backend gave up")

    with pytest.raises(Exception) as raised:
        torch.compile(lambda x: x * 2, backend=failing)(torch.ones(2))
    assert _compat.compiler_error(raised.value)  # BackendCompilerFailed, wrapping the backend's error
    inner = raised.value.inner_exception
    assert isinstance(inner, ValueError) and not _compat.compiler_error(inner)
    assert not _compat.compiler_error(torch.OutOfMemoryError("out of memory"))
    from torch._dynamo.exc import FailOnRecompileLimitHit, TorchRuntimeError

    assert _compat.compiler_error(FailOnRecompileLimitHit("recompile limit hit under fullgraph"))
    assert _compat.compiler_error(TorchRuntimeError("a shape error, found while tracing"))


def test_module_instances_share_compiled_code_as_measured_on_the_torches_ci_runs() -> None:
    # The probe decides how regional compile groups blocks; pinned here to what each CI torch was seen to do
    # (2.7: every block recompiled the shared code, guarded by its call's identity; 2.13: one graph per shape).
    from ampkit._compat import module_instances_share_compiled_code

    release = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    expected = {"2.7": False, "2.13": True}.get(release)
    if expected is None:
        pytest.skip(f"torch {torch.__version__}: not one of the releases CI runs (2.7, 2.13)")
    assert module_instances_share_compiled_code() is expected
