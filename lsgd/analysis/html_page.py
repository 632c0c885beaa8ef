"""report.html: the Markdown report as one self-contained HTML page (:func:`markdown_to_html`), its
figures embedded as base64 ``data:`` URIs at their print size, so the page can be opened in a
browser or sent as one file.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from lsgd.analysis.load import PathLike

#: Style of report.html: readable tables (borders, zebra rows, wide ones scroll), figures at most
#: the page's width.
HTML_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; margin: 2em auto;
       max-width: 1400px; padding: 0 1em; line-height: 1.45; color: #1b1b1b; background: #fff; }
h1, h2, h3 { line-height: 1.2; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.85em; display: block; overflow-x: auto; }
th, td { border: 1px solid #bbb; padding: .25em .55em; white-space: nowrap; }
th { background: #eef0f3; } tr:nth-child(even) td { background: #f8f9fa; }
img { max-width: 100%; height: auto; display: block; margin: 1em 0 .3em; }
code { background: #f1f1f1; padding: 0 .2em; border-radius: 3px; }
"""


def _data_uri(path: Path) -> str:
    kind = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
    mime = kind.get(path.suffix.lower(), "application/octet-stream")
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def print_width_in(path: Path) -> float | None:
    """The width in inches at which the image file ``path`` prints: its pixel width over the
    resolution its header records (PNG ``pHYs``, which matplotlib's ``savefig(dpi=...)`` writes;
    read with Pillow). None when the file records no resolution or is not a raster image."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            dpi = img.info.get("dpi")
            width = img.size[0]
    except (UnidentifiedImageError, OSError):
        return None
    if not dpi or not dpi[0] or float(dpi[0]) <= 1:  # no pHYs (Pillow may report 1 for "unknown")
        return None
    return width / float(dpi[0])


def markdown_to_html(text: str, base: PathLike, title: str = "lsgd report") -> str:
    """A self-contained HTML page of the Markdown ``text`` (report.md): rendered by markdown-it-py
    (CommonMark with GitHub's tables; raw HTML in the text is escaped, not passed through), every
    image whose source is a relative path under ``base`` embedded as a base64 ``data:`` URI, so
    the page shows its tables and figures with no other file; links (SVG, PDF, CSV, LaTeX) stay
    relative to ``base``. Styles inline (:data:`HTML_STYLE`), no script.

    Each embedded image is shown at its print size: a CSS ``width`` in ``in`` (1 in = 96 CSS px)
    from its pixel width and recorded resolution (:func:`print_width_in`), so a ``--width one``
    figure (975 px at 300 dpi) is 3.25 in wide on the page as in the paper, not 975 px; height
    follows the aspect ratio, and the page's width still caps it (``max-width: 100%``).

    Raises:
        FileNotFoundError: an image the text names is missing under ``base``.
    """
    from markdown_it import MarkdownIt

    base = Path(base)
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = md.parse(text)
    for token in tokens:
        for child in token.children or []:
            src = child.attrGet("src") if child.type == "image" else None
            if src and "://" not in src and not src.startswith(("data:", "/")):
                inches = print_width_in(base / src)
                child.attrSet("src", _data_uri(base / src))
                if inches is not None:
                    child.attrSet("style", f"width: {inches:.4g}in")
    body = md.renderer.render(tokens, md.options, {})
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html.escape(title)}</title>\n<style>{HTML_STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n")
