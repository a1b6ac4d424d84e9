"""The residual table: one HTML row per saved value, and the eqns the backward recomputes.

Example:
    >>> import jax.numpy as jnp, jaxaot
    >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
    >>> residual_table_html(low).count("</tr>")  # the header, one saved value, the total
    3
"""

from __future__ import annotations

import html
from typing import Any

from jaxaot._src import compat as C
from jaxaot._src.pytrees import format_aval
from jaxaot._src.runtime import ResidualTable
from jaxaot._src.units import format_bytes
from jaxaot._src.viz.formatting import short_source
from jaxaot._src.viz.lowered_parts import backward_is_cotangent_dependent, unwrap

_COLUMNS = ("#", "value", "shape", "dtype", "bytes", "where", "producer", "source line")


def residual_table_html(lowered: Any) -> str:
    """The residual table as an HTML fragment: value, shape, dtype, bytes, where, producer, source line.

    "where" is ``saved`` (device memory) or ``offloaded`` (host memory), with the
    ``PartitionSpec`` of a residual on a mesh.

    One row per saved value (inputs named by pytree path), a total row that
    tells the inputs' bytes apart from those the forward adds, and the list of
    eqns the backward recomputes (collapsed, in a ``<details>``). ``lowered`` is
    an ``AOTLowered``, a ``ModuleLowered``, a ``Partition`` or a ``ResidualTable``.

    Example:
        >>> from jaxaot.viz import residual_table_html
        >>> import jax.numpy as jnp, jaxaot
        >>> low = jaxaot.aot_function(lambda x: jnp.tanh(x).sum()).lower(jnp.ones(3))
        >>> t = residual_table_html(low)
        >>> "tanh" in t and "f32[3]" not in t and "<td>[3]</td>" in t
        True
    """
    if isinstance(lowered, ResidualTable):
        table, recomputed = lowered, [f"<li><code>{_text(s)}</code></li>" for s in lowered.recomputed]
    else:
        part, joint = unwrap(lowered, "residual_table_html")
        own = getattr(lowered, "residuals", None)  # a stage's own table knows where each residual lives on a mesh
        table = own if isinstance(own, ResidualTable) else ResidualTable.of(part, joint)
        recomputed = _recomputed_items(part)
    head = "".join(f"<th>{h}</th>" for h in _COLUMNS)
    rows = []
    for i, r in enumerate(table):
        cells = (str(i), _text(r.label), _text(str(list(r.shape))), _text(r.dtype),
                 f'<span title="{r.nbytes} bytes">{format_bytes(r.nbytes)}</span>',
                 _text(r.placement + (f" {r.sharding}" if r.sharding else "")), _text(r.producer),
                 _source_html(r.source_line) if r.source_line else "")
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    rows.append(f'<tr style="font-weight:bold"><td></td><td>total</td><td></td><td></td>'
                f'<td title="{table.nbytes} bytes">{format_bytes(table.nbytes)}</td>'
                f'<td colspan="3">{format_bytes(table.input_bytes)} of inputs, '
                f'{format_bytes(table.added_bytes)} added by the forward{_offload_total(table)}</td></tr>')
    details = (f"<details><summary>{len(recomputed)} eqns recomputed in the backward</summary>"
               f"<ul>{''.join(recomputed)}</ul></details>") if recomputed else ""
    return (f'<table class="jaxaot-residuals" style="border-collapse:collapse;font-size:90%">'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{details}")


def _offload_total(table: ResidualTable) -> str:
    """``, N offloaded to host memory`` (or why nothing was offloaded), else nothing."""
    offloaded = sum(r.nbytes for r in table if r.offloaded)
    if offloaded:
        return f", {format_bytes(offloaded)} offloaded to host memory"
    return f"; {_text(table.offload_note)}" if table.offload_note else ""


def _text(s: str) -> str:
    """``s`` escaped as HTML element text (not an attribute: quotes stay readable, ``arg[0]['w']``)."""
    return html.escape(s, quote=False)


def _source_html(source: str) -> str:
    """``file.py:12 (fn)`` with the full path as hover text."""
    line, fn = short_source(source)
    if line == "<unknown>":
        return "(no source line)"
    return f'<span title="{html.escape(source)}">{_text(line)} ({_text(fn)})</span>'


def _recomputed_items(part: Any) -> list[str]:
    """One ``<li>`` per backward eqn that depends on no cotangent: primitive, outputs, source."""
    bwd = C.jaxpr_of(part.backward)
    deps = backward_is_cotangent_dependent(part.backward, len(part.cotangent_outputs))
    items = []
    for eqn, dep in zip(bwd.eqns, deps):
        if not dep:
            outs = ", ".join(format_aval(v.aval) for v in eqn.outvars)
            items.append(f"<li><code>{_text(str(eqn.primitive))}</code> → {_text(outs)} "
                         f"<small>@ {_source_html(C.eqn_source(eqn))}</small></li>")
    return items
