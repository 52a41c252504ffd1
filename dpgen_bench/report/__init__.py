"""Reports are pure functions of the run records: collect → long frame → pivot → render."""

from .table import collect, render_markdown, runs_table

__all__ = ["collect", "render_markdown", "runs_table"]
