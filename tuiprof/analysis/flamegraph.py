"""A flame graph of a merged stack tree, as a self-contained SVG.

Widths are rank counts: a frame as wide as the graph was reached by every rank,
a sliver by one. Frames reached by the same rank set share a colour (STAT's
colouring), so the odd rank's path stands out; hovering shows the frame, the
ranks that reached it and the ranks that did not.
"""

from __future__ import annotations

import colorsys
import hashlib
from xml.sax.saxutils import escape, quoteattr

from agentd.stacks import ranksets
from agentd.stacks.merge import MergedStacks, Node
from tuiprof.analysis.stacks_report import frame_of

FRAME_HEIGHT = 18
FONT_SIZE = 12
CHAR_WIDTH = 7.0      # average glyph width of the monospace font at FONT_SIZE
MIN_TEXT_WIDTH = 24
TITLE_HEIGHT = 28

_Box = tuple[int, float, float, str, int, int]  # depth, x, width, label, ranks, missing


def flamegraph_svg(merged: MergedStacks, title: str = "merged stacks", width: int = 1200) -> str:
    """Every thread group side by side, each as wide as its share of (rank, thread) stacks."""
    total = sum(root.ranks.bit_count() for root in merged.threads.values())
    boxes: list[_Box] = []
    x = 0.0
    scale = width / total if total else 0.0
    for thread, root in sorted(merged.threads.items(), key=lambda kv: (-kv[1].ranks.bit_count(), kv[0])):
        span = root.ranks.bit_count() * scale
        boxes.append((0, x, span, f"thread {thread}", root.ranks, merged.missing(root)))
        _layout(merged, root, 1, x, scale, boxes)
        x += span
    depth = max((b[0] for b in boxes), default=0) + 1
    height = TITLE_HEIGHT + depth * FRAME_HEIGHT + 8
    majority = max((b[4] for b in boxes[1:]), key=lambda m: m.bit_count(), default=0)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="{FONT_SIZE}">',
        '<rect width="100%" height="100%" fill="#fdfdf8"/>',
        f'<text x="{width / 2:.1f}" y="18" text-anchor="middle" font-size="{FONT_SIZE + 3}">'
        f'{escape(title)} — {merged.ranks.bit_count()} ranks</text>',
    ]
    for level, left, span, label, ranks, missing in boxes:
        y = height - 4 - (level + 1) * FRAME_HEIGHT
        tip = f"{label}\nranks [{ranksets.fold(ranks, merged.unranked)}] ({ranks.bit_count()})"
        if missing:
            tip += f"\nnot reached by [{ranksets.fold(missing, merged.unranked)}]"
        out.append(f"<g><title>{escape(tip)}</title>")
        out.append(
            f'<rect x="{left:.2f}" y="{y}" width="{max(span - 0.5, 0.1):.2f}" height="{FRAME_HEIGHT - 1}" '
            f'fill={quoteattr(_colour(ranks, majority))} rx="2"/>'
        )
        if span >= MIN_TEXT_WIDTH:
            fits = int((span - 6) / CHAR_WIDTH)
            text = label if len(label) <= fits else label[: max(fits - 2, 0)] + ".."
            out.append(f'<text x="{left + 3:.2f}" y="{y + FRAME_HEIGHT - 5}">{escape(text)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _layout(merged: MergedStacks, root: Node, depth: int, x: float, scale: float, boxes: list[_Box]) -> None:
    pending = [(root, depth, x)]
    while pending:
        node, level, left = pending.pop()
        for child in node.sorted_children():
            span = child.ranks.bit_count() * scale
            boxes.append((level, left, span, frame_of(child).label(), child.ranks, merged.missing(child)))
            pending.append((child, level + 1, left))
            left += span


def _colour(ranks: int, majority: int) -> str:
    """Warm flame colours for the majority's rank set, a stable distinct hue for every other set."""
    if ranks == majority:
        return "#f2a65a"
    digest = hashlib.blake2b(ranks.to_bytes((ranks.bit_length() + 7) // 8 or 1, "little"), digest_size=2).digest()
    hue = int.from_bytes(digest, "little") / 65536
    r, g, b = colorsys.hls_to_rgb(hue, 0.72, 0.55)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"
