"""Helpers of the attack tests (cache and artifact trust): a deadline for calls that must not hang, and programs
and artifacts as an attacker writes them."""

from __future__ import annotations

import contextlib
import signal


class Hung(AssertionError):
    """A call that had to finish in seconds (it met a FIFO, say) did not."""


@contextlib.contextmanager
def deadline(seconds: int = 30):
    """Fail with :class:`Hung` if the block runs longer than ``seconds`` (SIGALRM, main thread only).

    A blocked ``open`` or ``read`` of a FIFO is interrupted by the signal, so a
    hang becomes a test failure instead of a stuck test run.
    """
    def on_alarm(signum, frame):
        raise Hung(f"did not finish within {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# --------------------------------------------------------------------------- programs an attacker writes
def program_from_text(text: str):
    """A stand-in for a deserialized ``jax.export.Exported`` whose StableHLO is ``text`` (what the audit reads)."""
    import types

    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    with mlir.make_ir_context():
        return types.SimpleNamespace(mlir_module_serialized=mlir.module_to_bytecode(ir.Module.parse(text)))


def with_program_text(exported, text: str):
    """``exported`` (a ``jax.export.Exported``) with its StableHLO replaced by ``text``."""
    import dataclasses

    return dataclasses.replace(exported, mlir_module_serialized=program_from_text(text).mlir_module_serialized)


def with_host_callback(exported, target: str = "xla_ffi_python_cpu_callback"):
    """``exported`` with a host callback ``target`` (index 0) planted before its ``sin``."""
    text = exported.mlir_module()
    callback = (f'%cb = stablehlo.custom_call @{target}(%arg0) {{backend_config = "", '
                'mhlo.backend_config = {index = 0 : ui64}, operand_layouts = [dense<0> : tensor<1xindex>], '
                'result_layouts = [dense<0> : tensor<1xindex>]} : (tensor<3xf32>) -> tensor<3xf32>\n    ')
    planted = text.replace("stablehlo.sine %arg0", "stablehlo.sine %cb", 1)
    assert planted != text
    planted = planted.replace("%0 = stablehlo.sine %cb", callback + "%0 = stablehlo.sine %cb", 1)
    return with_program_text(exported, planted)


def write_program(d, name: str, exported) -> None:
    """Replace a program of the artifact at ``d`` and fix its manifest entry (sha256, bytes), as an attacker
    with write access can."""
    import hashlib
    import json

    blob = bytes(exported.serialize())
    m = json.loads((d / "manifest.json").read_text())
    (d / m["artifacts"][name]["file"]).write_bytes(blob)
    m["artifacts"][name].update(sha256=hashlib.sha256(blob).hexdigest(), bytes=len(blob))
    (d / "manifest.json").write_text(json.dumps(m))
