"""Reports: pure data (:mod:`nnmem.report.model`) and renderers (text, JSON)."""

from nnmem.report.model import LayerRow, Report, TimelinePoint

__all__ = ["LayerRow", "Report", "TimelinePoint"]
