"""Text from jobs, nodes and workers as the pages show it: HTML-escaped, and unable to reorder what
is around it (docs/dashboard.md, "Security").

A name, reason or event may carry Unicode's explicit direction controls (U+202E RIGHT-TO-LEFT
OVERRIDE and its kin): raw, they reverse the text that follows them up to the end of the
paragraph, so a reason could make the rest of its row read as something else. `e` shows each
such control as a visible `[U+202E]` (everywhere: cells, attributes, titles, SVG labels), and
`bdi` also isolates a value in page text (a name written right to left keeps its own direction
and leaves its neighbours theirs).
"""

from __future__ import annotations

from html import escape

# Embeddings and overrides (LRE, RLE, PDF, LRO, RLO) and isolates (LRI, RLI, FSI, PDI). The marks
# (LRM, RLM, ALM) direct nothing but the neutral characters next to them, and stay.
BIDI_CONTROLS = {c: f"[U+{c:04X}]" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def e(value: object) -> str:
    """`value` HTML-escaped (quotes too: safe in attributes), direction controls made visible."""
    return escape(str(value).translate(BIDI_CONTROLS), quote=True)


def bdi(value: object) -> str:
    """A value from a user, a node or a worker, as page text: escaped and isolated (`<bdi>`)."""
    return f"<bdi>{e(value)}</bdi>"
