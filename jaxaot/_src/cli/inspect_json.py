"""``jaxaot inspect --json``: the split of one function as a JSON document, for scripts.

The document holds what the text report prints, as numbers and lists rather
than text: the residual table (one object per saved value), the saved bytes
(all, added beyond the inputs, offloaded to host memory, staying on the
device), the recomputed eqns, each stage's time in seconds, the compiled peaks
the planner measured under a byte budget, and the partitioner's notes. Keys are
stable; a key whose value is unknown holds ``null``.

Example:
    >>> import json, jax.numpy as jnp, jaxaot
    >>> low = jaxaot.aot_function(lambda x: jnp.sin(x).sum()).lower(jnp.ones(3))
    >>> doc = inspect_document(low, target="f", partition="default")
    >>> doc["saved_bytes"], doc["residuals"][0]["shape"], sorted(doc["times"])
    (12, [3], ['joint', 'partition', 'trace'])
    >>> json.loads(json.dumps(doc)) == doc
    True
"""

from __future__ import annotations

from typing import Any

#: The top-level keys of the document, in order.
KEYS = ("target", "partition", "budget", "offload", "residuals", "saved_bytes", "added_bytes", "input_bytes",
        "offloaded_bytes", "device_saved_bytes", "recomputed", "times", "predicted_peak", "notes")


def inspect_document(lowered: Any, *, target: str, partition: str, budget: float | str | None = None,
                     offload: str | None = None) -> dict[str, Any]:
    """The JSON-ready dict of ``lowered`` (an :class:`jaxaot.AOTLowered`) and the options it was built with."""
    table = lowered.residuals
    rows = []
    for row in table.to_rows():
        row["shape"] = list(row["shape"])
        rows.append(row)
    peak = lowered.predicted_peak
    part = lowered.partition
    doc = {
        "target": target,
        "partition": partition,
        "budget": budget,
        "offload": offload,
        "residuals": rows,
        "saved_bytes": int(lowered.saved_bytes),
        "added_bytes": int(table.added_bytes),
        "input_bytes": int(table.input_bytes),
        "offloaded_bytes": int(table.offloaded_bytes),
        "device_saved_bytes": int(lowered.device_saved_bytes),
        "recomputed": [str(e) for e in lowered.recomputed],
        "times": {k: float(v) for k, v in lowered.compile_times.items()},
        "predicted_peak": None if peak is None else {
            "fused": peak.fused, "forward": peak.forward, "backward": peak.backward, "budget": peak.budget},
        "notes": {"offload": getattr(part, "offload_note", ""), "cost": getattr(part, "cost_note", "")},
    }
    return {k: doc[k] for k in KEYS}
