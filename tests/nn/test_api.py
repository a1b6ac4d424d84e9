"""``aot_module``'s checks on the module and its options, and Flax loading only on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import jaxaot
from flax_models import Block
from zoo import child_env


def test_bad_module_and_options_raise_documented_errors():
    with pytest.raises(jaxaot.InvalidInputError, match="expects a flax.nnx.Module or a flax.linen.Module"):
        jaxaot.aot_module(lambda x: x)
    with pytest.raises(jaxaot.InvalidInputError, match="has no method 'nope'"):
        jaxaot.aot_module(Block(), method="nope")
    with pytest.raises(jaxaot.InvalidInputError, match="static_argnums must be non-negative"):
        jaxaot.aot_module(Block(), static_argnums=-1)


def test_flax_loads_only_when_a_module_api_is_used():
    code = ("import sys, jaxaot; assert 'flax' not in sys.modules, 'import jaxaot imported flax'; "
            "jaxaot.aot_module; assert 'flax' in sys.modules; from jaxaot import GraphSignature")
    subprocess.run([sys.executable, "-c", code], check=True, env=child_env(), timeout=300)
