"""ampkit inside Lightning: :class:`AmpkitPrecision`, a precision plugin for the Trainer and for Fabric.

Any ampkit policy (Lightning's own names and those it has none for: ``bf16-true-masters``, ``bf16-true-remainder``,
``bf16-true-kahan``, ``bf16-true-sr``, fp8's layer plan, ``16-mixed`` with ``keep_fp32``), with ampkit's loss scaler
(hysteresis, floor, ceiling, collapse diagnosis), the kernel guards and numerics sampling; its state goes into
Lightning's own checkpoint::

    import lightning as L
    from ampkit.lightning import AmpkitPrecision

    trainer = L.Trainer(plugins=[AmpkitPrecision("bf16-true-masters")])   # in place of precision="bf16-true"
    fabric = L.Fabric(plugins=[AmpkitPrecision("16-mixed", keep_fp32=["head"])])

Importing this package imports Lightning (``pip install 'ampkit[lightning]'``).
"""

from ._precision import AmpkitPrecision

__all__ = ["AmpkitPrecision"]
