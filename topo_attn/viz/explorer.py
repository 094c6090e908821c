"""A schedule explorer built on ipywidgets: a key-set choice, a block-size dropdown and sliders for sinks,
window and top-k; every change redraws the block mask and the statistics.

:meth:`ScheduleExplorer.update` does the work. It runs on every widget change and can also be called, or
driven by setting the widgets' values, without a browser or a kernel (the tests do this).

Displayed, the explorer shows its widgets and, under them, :data:`LIVE_KERNEL_NOTE` as plain HTML: a static copy
of a notebook (nbconvert's HTML) draws the widgets only where it can load the widget JavaScript from a CDN, and
their sliders never redraw there, so the page says in words what they need.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

import ipywidgets as w
import torch
from IPython.display import HTML, clear_output, display

from ..schedule import BlockSchedule, ScheduleCounts, num_blocks
from ..topology import (block_centroids, block_salience, schedule_from_salience, schedule_sources,
                        top_salient_blocks)
from . import figures

LIVE_KERNEL_NOTE = ("The sliders above need a live Jupyter kernel: from the repository, start JupyterLab with "
                    ".venv/bin/jupyter lab notebooks/ and run the notebook there. In a static HTML copy they do "
                    "nothing, and they appear only where the page can load the widget JavaScript from the "
                    "internet.")
"""Shown under the explorer's widgets, as plain HTML that every copy of a notebook renders."""


class ScheduleExplorer:
    """Widgets and state of the explorer. ``key_sets``: name -> keys ``[S, D]``. After each update,
    ``schedule`` (shared :class:`BlockSchedule`), ``sources`` (int8 ``[n, n]``,
    :func:`~topo_attn.schedule_sources`), ``counts``, ``figure`` and ``stats`` (HTML text) describe what is
    shown. Display the explorer (last expression of a cell) to get the controls and, under them, :meth:`note`."""

    def __init__(self, key_sets: Mapping[str, torch.Tensor], key_set: str | None = None, block_size: int = 64,
                 block_sizes: Sequence[int] = (16, 32, 64, 128), sinks: int = 1, window: int = 1,
                 topk: int = 4) -> None:
        if not key_sets:
            raise ValueError("key_sets is empty; expected at least one name -> keys [S, D]")
        self.key_sets = dict(key_sets)
        style = {"description_width": "80px"}
        self.key_set = w.Dropdown(options=list(self.key_sets), value=key_set or next(iter(self.key_sets)),
                                  description="key set", style=style)
        self.block_size = w.Dropdown(options=list(block_sizes), value=block_size, description="block size",
                                     style=style)
        self.sinks = w.IntSlider(value=sinks, min=0, max=max(sinks, 1), description="sinks", style=style,
                                 continuous_update=False)
        self.window = w.IntSlider(value=window, min=0, max=max(window, 1), description="window", style=style,
                                  continuous_update=False)
        self.topk = w.IntSlider(value=topk, min=0, max=max(topk, 1), description="top-k", style=style,
                                continuous_update=False)
        self.stats = w.HTML()
        self.output = w.Output()
        self.widget = w.VBox([w.HBox([self.key_set, self.block_size]), w.HBox([self.sinks, self.window, self.topk]),
                              self.stats, self.output])
        # stable hooks for the browser test (tests/test_explorer_browser.py)
        self.widget.add_class("topo-attn-explorer")
        self.stats.add_class("topo-attn-stats")
        self.output.add_class("topo-attn-mask")
        self.schedule: BlockSchedule | None = None
        self.sources: torch.Tensor | None = None
        self.counts: ScheduleCounts | None = None
        self.figure = None
        self._salience: dict[tuple[str, int], torch.Tensor] = {}
        self._quiet = False
        for control in (self.key_set, self.block_size, self.sinks, self.window, self.topk):
            control.observe(self._changed, names="value")
        self.update()

    def _changed(self, change: dict) -> None:
        if not self._quiet:
            self.update()

    def salience(self, name: str, block_size: int) -> torch.Tensor:
        """Block salience ``[n]`` float64 of key set ``name`` at ``block_size`` (computed once, then kept)."""
        if (name, block_size) not in self._salience:
            self._salience[name, block_size] = block_salience(block_centroids(self.key_sets[name], block_size))
        return self._salience[name, block_size]

    def update(self) -> ScheduleCounts:
        """Rebuild the schedule for the current widget values, redraw the mask, refresh the statistics.
        Slider ranges follow the block count (values beyond it are clamped). Returns the counts."""
        name, size = self.key_set.value, self.block_size.value
        keys = self.key_sets[name]
        seq_len, n = keys.shape[-2], num_blocks(keys.shape[-2], size)
        self._quiet = True  # range changes may clamp values; redraw once below
        try:
            self.sinks.max, self.window.max, self.topk.max = n, max(n - 1, 1), n
        finally:
            self._quiet = False
        sinks, window, topk = self.sinks.value, self.window.value, self.topk.value
        salience = self.salience(name, size)
        self.schedule = schedule_from_salience(salience, size, seq_len, window, sinks, topk)
        self.sources = schedule_sources(salience, size, seq_len, window, sinks, topk)
        self.counts = self.schedule.counts()
        top = top_salient_blocks(salience, topk).tolist()
        shown = ", ".join(map(str, top[:16])) + (f", ... ({len(top) - 16} more)" if len(top) > 16 else "")
        self.stats.value = (f"<b>{name}</b>: {seq_len} keys of dimension {keys.shape[-1]}, {n} blocks of {size} "
                            f"tokens<br>{self.counts}<br>top-{len(top)} salient blocks: [{shown}]")
        ax = figures.plot_schedule(self.schedule, self.sources,
                               title=f"{name}: sinks {sinks}, window {window}, top-{topk}")
        self.figure = ax.figure
        with self.output:
            clear_output(wait=True)
            figures.display_figure(self.figure)
        return self.counts

    def note(self) -> HTML:
        """:data:`LIVE_KERNEL_NOTE` as an IPython HTML object (a plain output, not a widget, so that a static
        copy shows it without JavaScript)."""
        return HTML(f'<p class="topo-attn-live-kernel-note"><i>{html.escape(LIVE_KERNEL_NOTE)}</i></p>')

    def _ipython_display_(self) -> None:
        """In IPython (a notebook cell's value, or ``display``): the widgets, then :meth:`note`."""
        display(self.widget)
        display(self.note())

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)
