"""Figures (``figures``, and ``lm`` for the language-model study; matplotlib) and the schedule explorer
(``explorer``, ipywidgets): the only modules of the package that import them. ``ScheduleExplorer`` is loaded on
first use, so the figures work without ipywidgets."""

from .figures import (EDGE_LABEL, METHOD_STYLES, METRIC_LABELS, NOT_CAUSAL, SCHEDULE_COLORS, SCHEDULED, SCHEDULED_COLOR,
                      SELECTOR_STYLES, TOP_COLOR, display_figure, pca_2d, plot_barcode, plot_benchmark, plot_centroids,
                      plot_persistence_diagram, plot_recall_vs_time, plot_salience, plot_schedule,
                      plot_selection_quality)
from .lm import (plot_lm_eviction, plot_lm_pareto, plot_lm_positions, plot_lm_recall, plot_lm_retrieval,
                 plot_lm_retrieval_suite, plot_lm_speed, plot_lm_training, selector_style)

__all__ = ["EDGE_LABEL", "METHOD_STYLES", "METRIC_LABELS", "NOT_CAUSAL", "SCHEDULE_COLORS", "SCHEDULED",
           "SCHEDULED_COLOR", "SELECTOR_STYLES", "TOP_COLOR", "ScheduleExplorer", "display_figure", "pca_2d",
           "plot_barcode", "plot_benchmark", "plot_centroids", "plot_lm_eviction", "plot_lm_pareto",
           "plot_lm_positions", "plot_lm_recall", "plot_lm_retrieval", "plot_lm_retrieval_suite", "plot_lm_speed",
           "plot_lm_training", "plot_persistence_diagram", "plot_recall_vs_time", "plot_salience", "plot_schedule",
           "plot_selection_quality", "selector_style"]


def __getattr__(name: str):
    if name == "ScheduleExplorer":  # (ipywidgets is imported here, on first use)
        from .explorer import ScheduleExplorer

        return ScheduleExplorer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
