"""jaxaot._src.units: the one byte formatter, read back by the budget parser."""

import numpy as np
import pytest

from jaxaot._src.partition.budget import parse_memory_budget
from jaxaot._src.units import byte_scale, format_bytes


def test_whole_bytes_below_a_kib_and_one_decimal_above():
    assert [format_bytes(n) for n in (0, 12, 1023)] == ["0 B", "12 B", "1023 B"]
    assert [format_bytes(n) for n in (1024, 1536, 3 * 2**20, 5 * 2**30 // 2)] == [
        "1.0 KiB", "1.5 KiB", "3.0 MiB", "2.5 GiB"]
    assert format_bytes(-2048) == "-2.0 KiB" and format_bytes(None) == "?"


@pytest.mark.parametrize("seed", range(3))
def test_the_text_reads_back_within_its_rounding(seed):
    """The budget parser reads the text back (``"1.5 KiB"`` is a valid budget) to within half a
    decimal of the unit ``byte_scale`` picked, on sizes spread over every unit."""
    rng = np.random.default_rng(seed)
    for n in np.unique(np.exp(rng.uniform(0, np.log(64 * 2**30), 200)).astype(np.int64)):
        size, unit = byte_scale(int(n))
        assert size <= n < (1024 * size if unit != "GiB" else np.inf)
        back = parse_memory_budget(format_bytes(int(n))).nbytes
        assert abs(back - n) <= 0.05 * size + 1, (n, format_bytes(int(n)), back)
