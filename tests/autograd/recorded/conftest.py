"""Every compiled-autograd test starts and ends with an empty backward cache."""

import pytest

from jaxaot import compiled_autograd


@pytest.fixture(autouse=True)
def _fresh_cache():
    compiled_autograd.reset()
    yield
    compiled_autograd.reset()
