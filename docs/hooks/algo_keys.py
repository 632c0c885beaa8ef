"""MkDocs hook: the algorithms' key tables of docs/configuration.md, generated from their typed
configs, so the defaults are stated once (the dataclass) and the page cannot drift from them.

A line ``<!-- algo-keys NAME -->`` becomes the table of ``algo=NAME``'s keys: key, default, allowed
values or bounds (the default bold among the choices), meaning (the field's ``doc``), from
``lsgd.algorithms.ALGORITHMS``' entry. An unknown name fails the build.
"""

from __future__ import annotations

import dataclasses
import re
import typing

MARKER = re.compile(r"^<!-- algo-keys (\w+) -->$", re.M)


def _value(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _allowed(field: dataclasses.Field, tp, default=dataclasses.MISSING) -> str:
    from lsgd.core.typed_config import _bounds_text, _type_name

    meta = field.metadata
    if meta.get("choices"):
        return " \\| ".join(f"**{_value(c)}**" if c == default and type(c) is type(default) else _value(c)
                             for c in meta["choices"])
    bounds = _bounds_text(meta)
    return f"{_type_name(tp)}{' ' + bounds if bounds else ''}"


def table(name: str) -> str:
    """The markdown table of ``algo=name``'s keys (all but ``name``)."""
    from lsgd.algorithms import ALGORITHMS

    entry = ALGORITHMS.entry(name)
    hints = typing.get_type_hints(entry.config)
    rows = ["| key | default | allowed | meaning |", "|---|---|---|---|"]
    for field in dataclasses.fields(entry.config):
        if field.name == "name":
            continue
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        doc = (field.metadata.get("doc") or "").replace("|", "\\|")
        rows.append(f"| `{field.name}` | `{_value(default)}` | {_allowed(field, hints[field.name], default)} | {doc} |")
    if len(rows) == 2:
        return "No keys besides `name`."
    where = f"`{entry.config.__name__}` in `{entry.obj.__module__.replace('.', '/')}.py`"
    return "\n".join(rows) + f"\n\n(Declared by {where}.)"


def on_page_markdown(markdown: str, page, config, files) -> str:
    return MARKER.sub(lambda m: table(m.group(1)), markdown)
