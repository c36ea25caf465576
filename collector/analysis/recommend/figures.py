"""The figures a recommendation is shown with: one current QPS, one predicted QPS,
one gain. Every view (the CLI's text, the report, the UI) reads them here, so a page
never shows two "current" figures or two gains for the same recommendation.

The current figure is what was measured (``Recommendation.current.qps``, the observed
window). A tune's predicted QPS is that measured figure times the batcher model's
ratio of the proposed config to the running one (both simulated alike, so the model's
own bias cancels); the gain is that ratio. A probe or a kept config claims no gain.
"""

from __future__ import annotations

from dataclasses import dataclass

from collector.records import Recommendation

__all__ = ["GainFigures", "gain_figures", "recommendation_figures"]


@dataclass(frozen=True)
class GainFigures:
    """``current_qps`` measured, ``predicted_qps`` for the proposed config, and
    ``gain`` = predicted / current (``None`` when no gain is claimed)."""

    current_qps: float
    predicted_qps: float
    gain: float | None

    def text(self) -> str:
        """``"1.18× the current 567"``, or ``"no gain claimed; current 567"``."""
        if self.gain is None:
            return f"no gain claimed; current {self.current_qps:.0f}"
        return f"{self.gain:.2f}× the current {self.current_qps:.0f}"


def gain_figures(current_qps: float, predicted_qps: float | None) -> GainFigures:
    """Figures from a measured current QPS and a predicted one (``None``: no claim)."""
    if predicted_qps is None or current_qps <= 0:
        return GainFigures(current_qps=current_qps, predicted_qps=current_qps, gain=None)
    return GainFigures(
        current_qps=current_qps, predicted_qps=predicted_qps, gain=predicted_qps / current_qps
    )


def recommendation_figures(rec: Recommendation) -> GainFigures:
    """The one current figure and the one gain of ``rec``: what every view shows."""
    if rec.kind != "tune":
        return gain_figures(rec.current.qps, None)
    return gain_figures(rec.current.qps, rec.predicted.qps)
