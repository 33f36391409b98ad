"""Precision policy names and aliases as text, and the closest one to a name that is neither.

The policies themselves live in :mod:`ampkit.policy._registry`, which imports torch. Their names live here, in the
bottom layer, so that the command line refuses ``--precision fp16-mixed`` (naming ``16-mixed``) before it imports
torch, and the registry resolves names from the same table (a test holds the two equal).

    >>> canonical_name("FP16"), canonical_name("fp16-mixed")
    ('16-mixed', None)
    >>> suggest("fp16-mixed"), suggest("half-true"), suggest("float32"), suggest("01")
    ('16-mixed', '16-true', '32-true', 'O1')
"""

from __future__ import annotations

import difflib
import re

__all__ = ["ALIASES", "POLICY_NAMES", "canonical_name", "suggest", "unknown_precision"]

POLICY_NAMES = (
    "32-true",
    "tf32",
    "bf16-mixed",
    "16-mixed",
    "bf16-true",
    "16-true",
    "bf16-true-masters",
    "bf16-true-remainder",
    "bf16-true-kahan",
    "bf16-true-sr",
    "16-true-masters",
    "fp8-tensorwise",
    "fp8-rowwise",
)
"""Every canonical policy name, in the order tables list them."""

ALIASES: dict[str, str] = {
    "32": "32-true",
    "fp32": "32-true",
    "float32": "32-true",
    "no": "32-true",
    "16": "16-mixed",
    "fp16": "16-mixed",
    "float16": "16-mixed",
    "bf16": "bf16-mixed",
    "bfloat16": "bf16-mixed",
    "fp8": "fp8-tensorwise",  # Accelerate's mixed_precision="fp8"
    # Apex opt levels (capital letter O, then a digit)
    "O0": "32-true",
    "O1": "16-mixed",
    "O2": "16-true-masters",
    "O3": "16-true",
}
"""What users type elsewhere: Accelerate's ``no``/``fp16``/``bf16``, bare dtypes, and Apex's opt levels."""

_LOOKUP = {k.lower(): v for k, v in {**{n: n for n in POLICY_NAMES}, **ALIASES}.items()}

# A dtype's other spellings, as the names spell it: a user who types fp16-mixed means fp16 (16-mixed), which
# spelling alone would take for bf16-mixed (one letter away).
_DTYPE_WORDS = {"fp16": "16", "float16": "16", "half": "16", "fp32": "32", "float32": "32", "float": "32", "bfloat16": "bf16"}


def canonical_name(name: str) -> str | None:
    """The canonical policy name ``name`` (a name or alias, any case) stands for; None when it stands for none."""
    return _LOOKUP.get(name.strip().lower())


def suggest(name: str) -> str | None:
    """The policy name (or alias) closest to ``name``, which is neither; None when nothing is close."""
    text = name.strip()
    # Apex users type the digit zero for the letter O ("01"); that is the commonest miss, so check it first.
    if len(text) == 2 and text[0] == "0" and text[1].isdigit() and f"O{text[1]}" in ALIASES:
        return f"O{text[1]}"
    words = re.split(r"[-_ ]+", text.lower())
    spelled = "-".join(_DTYPE_WORDS.get(word, word) for word in words)
    if spelled in _LOOKUP:
        return _LOOKUP[spelled]
    close = difflib.get_close_matches(spelled, list(_LOOKUP), n=1, cutoff=0.5)
    if not close:
        return None
    return next((k for k in [*POLICY_NAMES, *ALIASES] if k.lower() == close[0]), close[0])


def unknown_precision(name: object) -> str:
    """The message for a precision that is no policy name or alias: the closest, then every valid one.

    >>> unknown_precision("fp16-mixed")[:60]
    "Unknown precision 'fp16-mixed'. Did you mean '16-mixed'? Val"
    """
    hint = suggest(str(name))
    did_you_mean = f" Did you mean {hint!r}?" if hint else ""
    return f"Unknown precision {name!r}.{did_you_mean} Valid: {', '.join(POLICY_NAMES)}; aliases: {', '.join(ALIASES)}."
