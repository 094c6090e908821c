"""The markdown tables the benchmark suites print: one header helper for all of them."""

from __future__ import annotations

from collections.abc import Sequence


def markdown_header(columns: Sequence[str], left: int = 1) -> list[str]:
    """The header row and the alignment row of a markdown table with ``columns``: the first ``left`` columns
    left-aligned (``---``), the others right-aligned (``---:``)."""
    align = " --- |" * left + " ---: |" * (len(columns) - left)
    return ["| " + " | ".join(columns) + " |", "|" + align]
