"""One ``memory_budget``, one meaning: every entry point reads it as :func:`parse_memory_budget` does.

A table of inputs, each with the one answer it must get (a fraction, bytes, or a typed error
with the words that say what was wrong), is fed to every entry point: the parser itself, the
min-cut configured (its options dataclass too) and applied, ``aot_function``, ``aot_module``, the pipeline's stages,
``remat_policy`` and ``jaxaot inspect --budget``. Where an input is valid, the plans the entry
points make are compared with the min-cut's own at the parsed budget.
"""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxaot
from jaxaot._src.cli import main as cli
from jaxaot._src.cli import demo_models
from jaxaot.errors import InvalidInputError, InvalidValueError
from jaxaot._src.partition import MemoryBudget, parse_memory_budget, remat_policy

mincut = jaxaot.partition.min_cut_rematerialization_partition

F, B = MemoryBudget, (lambda n: MemoryBudget(nbytes=n))
#: (input, answer): a MemoryBudget, or (error type, a regex of its message).
TABLE = [
    (0.0, F(fraction=0.0)), (0.5, F(fraction=0.5)), (1.0, F(fraction=1.0)), (np.float32(0.25), F(fraction=0.25)),
    (0, F(fraction=0.0)), (1, F(fraction=1.0)), ("0.5", F(fraction=0.5)), ("1", F(fraction=1.0)),
    (4096, B(4096)), (np.int64(4096), B(4096)), (1e6, B(10**6)), ("1e6", B(10**6)), ("12000", B(12000)),
    ("1MB", B(10**6)), ("2.5kB", B(2500)), (" 3 KiB ", B(3 * 1024)), ("2e3B", B(2000)),
    (1.5, (InvalidValueError, r"1\.5 is above 1, so it is not a fraction.*Did you mean '1\.5GB'")),
    ("1.5", (InvalidValueError, r"'1\.5' is above 1, so it is not a fraction.*Did you mean '1\.5GB'")),
    (0.1 * 3 / 0.3, (InvalidValueError, r"1\.0000000000000002 is above 1.*Did you mean the fraction 1\.0 ")),
    (1e6 + 0.5, (InvalidValueError, r"not a whole number of bytes.*Did you mean 1000000 ")),
    (-0.1, (InvalidValueError, r"=-0\.1 is negative")), (-5, (InvalidValueError, r"=-5 is negative")),
    ("-1GB", (InvalidValueError, r"'-1GB' is negative")), ("-1", (InvalidValueError, r"'-1' is negative")),
    (float("nan"), (InvalidValueError, "is not a finite number")), ("inf", (InvalidValueError, "not a finite")),
    ("1e400GB", (InvalidValueError, "'1e400GB' is more bytes than a float holds")),
    ("0GB", (InvalidValueError, "is 0 bytes: a byte budget must be at least 1 byte")),
    ("0.2B", (InvalidValueError, "not a whole number of bytes")),
    ("1.5B", (InvalidValueError, r"'1\.5B' is not a whole number of bytes\. Did you mean '1\.5GB'")),
    ("4.5kB", B(4500)),
    ("1.4G", (InvalidValueError, r"unknown unit 'G' \(GB or GiB\?\)")),
    ("lots", (InvalidValueError, "is not a number, nor a number and a unit")),
    (True, (InvalidInputError, "got bool")), (None, (InvalidInputError, "got NoneType")),
    (b"1GB", (InvalidInputError, "got bytes")), ([1e9], (InvalidInputError, "got list")),
]
IDS = [repr(v) for v, _ in TABLE]


def _w_x():
    return jnp.full((16, 4), 0.1), jnp.linspace(-1.0, 1.0, 128).reshape(8, 16)


def _check(answer, run):
    """``run()`` gives ``answer`` (returned) or raises its error."""
    if isinstance(answer, MemoryBudget):
        return run()
    kind, words = answer
    with pytest.raises(kind, match=words):
        run()
    return None


def _plan(part) -> tuple:
    """What identifies a plan: its residuals and recomputed eqns, and the byte budget it fits."""
    peak = part.step_peak
    return (tuple((r.source, r.index) for r in part.residuals), len(part.recomputed),
            None if peak is None else peak.budget)


@pytest.fixture(scope="module")
def reference():
    """The min-cut's own plans of ``tanh_loss``, per parsed budget."""
    joint = jaxaot.partition.trace_joint(demo_models.tanh_loss, *_w_x())
    cache = {}

    def plan(budget: MemoryBudget):
        if budget not in cache:
            cache[budget] = _plan(mincut(joint, memory_budget=budget))
        return cache[budget]
    return joint, plan


@pytest.mark.parametrize("value, answer", TABLE, ids=IDS)
def test_the_parser(value, answer):
    got = _check(answer, lambda: parse_memory_budget(value))
    assert got is None or got == answer


@pytest.mark.parametrize("value, answer", TABLE, ids=IDS)
def test_the_min_cut_configured_and_applied(value, answer, reference):
    joint, plan = reference
    _check(answer, lambda: mincut(memory_budget=value))
    options = _check(answer, lambda: jaxaot.partition.MinCutOptions(memory_budget=value))  # the public dataclass
    assert options is None or options.memory_budget == answer
    _check(answer, lambda: jaxaot._src.partition.as_partitioner(functools.partial(mincut, memory_budget=value)))
    part = _check(answer, lambda: functools.partial(mincut, memory_budget=value)(joint))
    if part is not None:
        assert _plan(part) == plan(answer)


@pytest.mark.parametrize("value, answer", TABLE, ids=IDS)
def test_aot_function(value, answer, reference):
    _, plan = reference
    f = _check(answer, lambda: jaxaot.aot_function(demo_models.tanh_loss,
                                                   partition_fn=functools.partial(mincut, memory_budget=value)))
    if f is not None:
        assert _plan(f.lower(*_w_x()).partition) == plan(answer)


@pytest.mark.parametrize("value, answer", TABLE, ids=IDS)
def test_aot_module_and_pipeline_stages(value, answer):
    from flax import nnx

    pf = functools.partial(mincut, memory_budget=value)
    _check(answer, lambda: jaxaot.nn.aot_module(nnx.Linear(3, 2, rngs=nnx.Rngs(0)), partition_fn=pf))
    stage = lambda p, x: jnp.tanh(x @ p)  # noqa: E731
    _check(answer, lambda: jaxaot.parallel.pipeline([stage, stage], lambda y, t: jnp.mean((y - t) ** 2), num_microbatches=2,
                                           devices=[jax.devices()[0]] * 2, partition_fn=pf, executor="python"))


@pytest.mark.parametrize("value, answer", TABLE, ids=IDS)
def test_remat_policy(value, answer, reference):
    _, plan = reference
    policy = _check(answer, lambda: remat_policy(demo_models.tanh_loss, *_w_x(), memory_budget=value))
    if policy is not None:
        assert policy.memory_budget == answer.value


TEXTS = [(v, a) for v, a in TABLE if isinstance(v, (str, int, float)) and not isinstance(v, bool)]


@pytest.mark.parametrize("value, answer", TEXTS, ids=[repr(v) for v, _ in TEXTS])
def test_the_command_line(value, answer, reference, capsys):
    """``--budget`` takes text: a number's ``str`` means what the number means."""
    _, plan = reference
    text = value if isinstance(value, str) else str(value)
    argv = ["inspect", "jaxaot._src.cli.demo_models:tanh_loss", "--shapes", "f32[16,4] f32[8,16]", f"--budget={text}",
            "--json"]
    code = cli.main(argv)
    out, err = capsys.readouterr()
    if isinstance(answer, MemoryBudget):
        assert code == 0, err
        doc = json.loads(out)
        want = plan(answer)
        assert (len(doc["residuals"]), doc["predicted_peak"] and doc["predicted_peak"]["budget"]) == (
            len(want[0]), want[2])
    else:
        assert code == 2
        assert f"error: --budget {text}: memory_budget" in err, err
        # the command's words are the parser's (its first line)
        with pytest.raises(answer[0]) as caught:
            parse_memory_budget(text)
        assert str(caught.value).splitlines()[0] in err
