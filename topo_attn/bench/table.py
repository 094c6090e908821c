"""The markdown tables the benchmark suites print: one header helper and one cell helper for all of them."""

from __future__ import annotations

import math
from collections.abc import Sequence


def markdown_header(columns: Sequence[str], left: int = 1) -> list[str]:
    """The header row and the alignment row of a markdown table with ``columns``: the first ``left`` columns
    left-aligned (``---``), the others right-aligned (``---:``)."""
    align = " --- |" * left + " ---: |" * (len(columns) - left)
    return ["| " + " | ".join(columns) + " |", "|" + align]


def shown(value: object, form: str, unit: str = "") -> str:
    """A table cell: ``value`` formatted by ``form`` with ``unit`` after it, or empty where it is missing (None,
    or a float NaN: a path not run, a column a row does not have, a cell read back from a data frame)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return format(value, form) + unit
