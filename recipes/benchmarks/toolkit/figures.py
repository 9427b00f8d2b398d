"""The benchmarks' figures: matplotlib on its file-only backend, and a figure laid out, written and closed."""

import os


__all__ = ["pyplot", "save_figure"]


def pyplot():
    """`matplotlib.pyplot` on the Agg backend (PNG files, no display), imported only by a benchmark that draws."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str, dpi: int = 120) -> str:
    """Lay `fig` out, write it to `path` (its folder made if missing) and close it; returns `path`."""
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
