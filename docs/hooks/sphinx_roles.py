"""A griffe extension for the API reference: Sphinx-style inline roles in the docstrings
(:class:`lsgd.x.Y`, :func:`~lsgd.x.f`, :mod:`lsgd.x`, :data:`X`, ...) render as code (`lsgd.x.Y`)
instead of the role's raw text. Only the rendered pages change; the docstrings stay as written.
mkdocs.yml loads it (mkdocstrings' python handler, ``extensions``)."""

from __future__ import annotations

import re

import griffe

#: ``:role:`target``` and ``:role:`~target``` (the tilde: show the last component only, as Sphinx does)
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|obj|exc|const)[:]?`(~?)([^`]+)`")


def _plain(match: re.Match) -> str:
    short, target = match.group(1), match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class SphinxRoles(griffe.Extension):
    """Rewrite the roles of every docstring griffe loads (modules, classes, functions, attributes)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:  # noqa: ARG002
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_plain, obj.docstring.value)
