"""Pictures of the all-to-all pattern: who sends how many bytes to whom, per phase.

Taught in chapter 07 (section 8, bytes moved per step).
"""

from __future__ import annotations

from collections.abc import Sequence

from course_utils.sharding.volume import matrix

__all__ = ["draw_pattern"]

PANELS = (
    ("ids out", ("counts", "ids")),
    ("pooled embeddings back", ("embeddings",)),
    ("gradients (backward)", ("gradients",)),
)


def draw_pattern(traffic_by_kind: dict, title: str = ""):
    """One row of heatmaps per sharding kind (``{kind: [Traffic.as_dict() per rank]}``): cell
    ``(src, dst)`` is the bytes rank ``src`` sent rank ``dst`` in one step (written in B or KiB), for
    the ids going out, the pooled embeddings coming back and the gradients of the backward pass; one colour
    scale for all panels, so darker means more bytes anywhere in the figure."""
    import matplotlib.pyplot as plt

    kinds = list(traffic_by_kind)
    top = max(max(map(max, matrix(traffic_by_kind[k], phases))) for k in kinds for _, phases in PANELS)
    fig, axes = plt.subplots(len(kinds), len(PANELS), figsize=(9, 2.6 * len(kinds)), dpi=90, squeeze=False)
    for row, kind in enumerate(kinds):
        per_rank: Sequence[dict] = traffic_by_kind[kind]
        for col, (name, phases) in enumerate(PANELS):
            m = matrix(per_rank, phases)
            ax = axes[row][col]
            ax.imshow(m, cmap="Blues", vmin=0, vmax=max(top, 1) * 1.3)  # one scale for all panels
            for s, line in enumerate(m):
                for d, nbytes in enumerate(line):
                    ax.text(
                        d,
                        s,
                        "-" if s == d else f"{nbytes / 1024:.1f} KiB" if nbytes >= 1024 else f"{nbytes} B",
                        ha="center",
                        va="center",
                        fontsize=7,
                    )
            ax.set_xticks(range(len(m)))
            ax.set_yticks(range(len(m)))
            ax.set_title(f"{kind.replace('_', '-')}: {name}", fontsize=9)
            ax.set_xlabel("to rank", fontsize=8)
            if col == 0:
                ax.set_ylabel("from rank", fontsize=8)
    unit = "cell (src, dst): bytes rank src sent to rank dst (B = bytes, KiB = 1024 bytes)"
    fig.suptitle(f"{title}\n{unit}" if title else unit, fontsize=10)
    fig.tight_layout()
    return fig
