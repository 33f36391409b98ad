"""apex.multi_tensor_apply imports as Apex built without amp_C shipped it: ``available`` is False, a call raises."""

from __future__ import annotations

import pytest
import torch

from ampkit.apex import install

pytestmark = pytest.mark.usefixtures("forget_apex_modules")


def test_imports_through_apex_with_apexs_surface():
    install()
    import apex
    from apex.multi_tensor_apply import MultiTensorApply, multi_tensor_applier

    assert apex.multi_tensor_apply.multi_tensor_applier is multi_tensor_applier  # `import apex` then attribute access
    assert multi_tensor_applier.available is False and MultiTensorApply.available is False
    assert multi_tensor_applier.warned is False
    assert multi_tensor_applier.chunk_size == 2048 * 32
    assert isinstance(multi_tensor_applier.import_err, ImportError) and "amp_C" in str(multi_tensor_applier.import_err)


def test_a_script_that_checks_available_takes_its_fallback():
    install()
    from apex.multi_tensor_apply import multi_tensor_applier

    grads = [torch.full((3,), 4.0), torch.full((2,), 8.0)]
    if multi_tensor_applier.available:  # the idiom of Apex-era scripts
        raise AssertionError("the amp_C path must not be taken")
    torch._foreach_mul_(grads, 0.25)
    assert [g.tolist() for g in grads] == [[1.0] * 3, [2.0] * 2]


def test_calling_it_raises_and_names_the_replacements():
    install()
    from apex.multi_tensor_apply import multi_tensor_applier

    called = []
    with pytest.raises(RuntimeError, match=r"not available: ampkit provides no amp_C kernels.*torch\._foreach_mul_.*fused=True"):
        multi_tensor_applier(lambda *a: called.append(a), torch.zeros(1, dtype=torch.int), [[torch.ones(2)], [torch.ones(2)]], 0.5)
    assert called == []  # the op is never run
    with pytest.raises(RuntimeError, match="not available"):
        multi_tensor_applier.check_avail()
