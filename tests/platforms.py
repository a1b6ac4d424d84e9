"""The CPU standing in for an accelerator: where layouts are chosen, patched in the one place the runtime reads it."""

import importlib

# The module, not the function of the same name that its package re-exports.
STEP_PROGRAM = importlib.import_module("jaxaot._src.partition.step.step_program")


def layouts_chosen(monkeypatch, chosen: bool = True) -> None:
    """As on an accelerator (``chosen``: the CPU chooses residual layouts too), or as on a CPU everywhere (no
    platform chooses them)."""
    platforms = STEP_PROGRAM.LAYOUT_CHOICE_PLATFORMS | {"cpu"} if chosen else frozenset()
    monkeypatch.setattr(STEP_PROGRAM, "LAYOUT_CHOICE_PLATFORMS", platforms)
