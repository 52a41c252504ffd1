"""Reports are pure functions of the run records: collect → long frame → pivot → render."""

from .table import (RENDERERS, aggregate, collect, layout_a, layout_b, layout_c, render_csv, render_latex,
                    render_markdown, runs_table)

__all__ = ["RENDERERS", "aggregate", "collect", "layout_a", "layout_b", "layout_c", "render_csv", "render_latex",
           "render_markdown", "runs_table"]
