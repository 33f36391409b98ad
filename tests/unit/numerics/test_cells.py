"""ampkit.numerics._cells: the cells every doctor table prints the same way."""

from __future__ import annotations

import math

from ampkit.numerics._cells import MODEL_LABEL, fmt_cosine, fmt_error, module_label


def test_relative_errors_line_up_in_a_column_and_missing_ones_read_as_missing() -> None:
    errors = [1.0, 0.5, 3.1e-3, 4.88e-4, 1.2e-8]
    cells = [fmt_error(e) for e in errors]
    assert len({len(c) for c in cells}) == 1  # one width: the column lines up
    assert [float(c) for c in cells] == [float(f"{e:.1e}") for e in errors]  # two significant digits, nothing else lost
    assert fmt_error(0.0) == "0" and fmt_error(None) == fmt_error(math.nan) == fmt_cosine(None) == "—"


def test_a_cosine_keeps_the_digits_where_two_runs_differ() -> None:
    assert fmt_cosine(0.99998712) == "0.999987" and fmt_cosine(1.0) == "1.000000"


def test_the_root_module_has_a_name_on_screen() -> None:
    assert module_label("") == module_label(None) == MODEL_LABEL == "(model)"
    assert module_label("encoder.layers.0") == "encoder.layers.0"
