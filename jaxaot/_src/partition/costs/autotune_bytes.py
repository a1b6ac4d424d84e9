"""Device bytes a compile holds while it runs, for the plan-time allowance (:mod:`jaxaot._src.allowance`).

A CPU compile holds no device memory. A GPU compile autotunes its matrix products
and convolutions: it runs candidate kernels on buffers of each one's operands and
result (and a second result to check candidates against), every buffer padded by
red zones. One is tuned at a time, so the largest counts. The estimate is read off
the jaxpr before lowering, and only over-counts what XLA fuses away. A program that
only times ops compiles untuned (:func:`compile_untuned`).

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxaot._src.partition.costs.autotune_bytes import compile_bytes
    >>> closed = jax.make_jaxpr(jnp.dot)(jnp.ones((256, 128)), jnp.ones((128, 64)))
    >>> compile_bytes(closed, "cpu"), compile_bytes(closed, "gpu") > 256 * 128 * 4
    (0, True)
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from jaxaot._src import compat as C
from jaxaot._src.pytrees import var_device_nbytes

#: Primitives a GPU compile autotunes.
TUNED = frozenset({"dot_general", "conv_general_dilated"})
#: Red-zone bytes around each buffer an autotuner allocates (XLA's default padding, both ends).
REDZONE_BYTES = 2 * (8 << 20)
#: Platforms whose compiles hold no device memory.
UNTUNED_PLATFORMS = frozenset({"cpu"})
#: XLA options a timing program compiles with, per platform: on a GPU no autotuning, and cuBLAS (whose own
#: heuristic picks a kernel without running candidates) for every matrix product.
UNTUNED_OPTIONS: Mapping[str, Mapping[str, Any]] = {
    p: {"xla_gpu_autotune_level": 0, "xla_gpu_enable_triton_gemm": False} for p in ("gpu", "cuda", "rocm")}
#: Primitives whose timing programs keep XLA's defaults: a convolution's algorithm, left to the library's
#: heuristic, was not measured against the autotuned one, as matrix products' kernels were.
KEEP_TUNED = frozenset({"conv_general_dilated"})


def eqn_bytes(eqn: Any) -> int:
    """What autotuning ``eqn`` holds: its operands, its result twice, each buffer with red zones; 0 for an
    eqn not tuned."""
    if eqn.primitive.name not in TUNED:
        return 0
    ins = [v for v in eqn.invars if not C.is_literal(v)]
    return (sum(var_device_nbytes(v) for v in ins) + 2 * sum(var_device_nbytes(v) for v in eqn.outvars)
            + REDZONE_BYTES * (len(ins) + 2 * len(eqn.outvars)))


def eqns_bytes(eqns: Iterable[Any], platform: str) -> int:
    """The device bytes a compile of these eqns holds on ``platform``: the largest eqn's autotuning."""
    if platform in UNTUNED_PLATFORMS:
        return 0
    return max((eqn_bytes(e) for e in eqns), default=0)


def compile_bytes(closed: Any, platform: str) -> int:
    """The device bytes compiling the (closed) jaxpr ``closed`` holds on ``platform``, its sub-jaxprs (loop
    bodies, calls) included (module docstring)."""
    return eqns_bytes(C.iter_eqns(closed), platform)  # on an untuned platform, no eqn is read


def untuned_bytes(eqns: Sequence[Any], platform: str) -> int:
    """The device bytes a :func:`compile_untuned` of a program timing ``eqns`` holds on ``platform``: none
    where it compiles untuned, else their autotuning (:func:`eqns_bytes`)."""
    return 0 if compiles_untuned(platform, eqns) else eqns_bytes(eqns, platform)


def compiles_untuned(platform: str, eqns: Sequence[Any] = ()) -> bool:
    """Whether :func:`compile_untuned` compiles a program timing ``eqns`` without autotuning on ``platform``:
    the platform has options, this process's XLA has not refused them, and no eqn is :data:`KEEP_TUNED`."""
    return (platform in UNTUNED_OPTIONS and platform not in _REFUSED
            and not any(e.primitive.name in KEEP_TUNED for e in eqns))


_REFUSED: set[str] = set()  # platforms whose XLA refused UNTUNED_OPTIONS (their defaults compiled instead)


def compile_untuned(lowered: Any, platform: str, eqns: Sequence[Any] = ()) -> Any:
    """``lowered.compile()`` with :data:`UNTUNED_OPTIONS` where :func:`compiles_untuned`: what a program that
    times ``eqns`` (or the device's rates) compiles as.

    Autotuning a timing program's matrix products is most of its compile, and was most of a fraction's
    planning on a GPU, for kernels whose times cuBLAS's own choice matched within the timings' noise
    (``docs/benchmarks.md``, "Op timings"). Where XLA refuses the options and compiles the program with its
    defaults, the process compiles with its defaults from then on (:func:`compiles_untuned` says so).
    """
    if not compiles_untuned(platform, eqns):
        return lowered.compile()
    try:
        return lowered.compile(compiler_options=dict(UNTUNED_OPTIONS[platform]))
    except Exception:  # noqa: BLE001 - an XLA without these options: its defaults, from now on
        exe = lowered.compile()  # a program no compile takes raises here
        _REFUSED.add(platform)
        return exe
