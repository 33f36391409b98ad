"""The training layer: the engine and what one optimizer step is made of.

It sits on policy, scaling and the distributed strategies, and below checkpoints and every tool. The modules:
:mod:`~ampkit.training._engine` (the user-facing loop API), :mod:`~ampkit.training._step_state` (its counters and
the last step's outcome), :mod:`~ampkit.training._optimizer_step` (the step component), :mod:`~ampkit.training._clipping`,
:mod:`~ampkit.training._kernel_guards` (known torch kernel defects) and :mod:`~ampkit.training._micro_batching`
(splitting a batch that runs out of memory). Importing this package imports none of them.
"""
