"""Figures (``figures``, matplotlib) and the schedule explorer (``explorer``, ipywidgets): the only modules of the
package that import them. ``ScheduleExplorer`` is loaded on first use, so the figures work without ipywidgets."""

from .figures import (EDGE_LABEL, METHOD_STYLES, METRIC_LABELS, NOT_CAUSAL, SCHEDULE_COLORS, SCHEDULED, SCHEDULED_COLOR,
                      SELECTOR_STYLES, TOP_COLOR, display_figure, pca_2d, plot_barcode, plot_benchmark, plot_centroids,
                      plot_persistence_diagram, plot_recall_vs_time, plot_salience, plot_schedule,
                      plot_selection_quality)

__all__ = ["EDGE_LABEL", "METHOD_STYLES", "METRIC_LABELS", "NOT_CAUSAL", "SCHEDULE_COLORS", "SCHEDULED",
           "SCHEDULED_COLOR", "SELECTOR_STYLES", "TOP_COLOR", "ScheduleExplorer", "display_figure", "pca_2d",
           "plot_barcode", "plot_benchmark", "plot_centroids", "plot_persistence_diagram", "plot_recall_vs_time",
           "plot_salience", "plot_schedule", "plot_selection_quality"]


def __getattr__(name: str):
    if name == "ScheduleExplorer":  # (ipywidgets is imported here, on first use)
        from .explorer import ScheduleExplorer

        return ScheduleExplorer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
