"""parlab.units.format_bytes: one unit system (decimal) for every printed byte count."""
import pytest

from parlab.units import GB, format_bytes


@pytest.mark.parametrize("n,text", [(0, "0 B"), (48, "48 B"), (999, "999 B"), (1000, "1 kB"),
                                    (1536, "1.54 kB"), (16 * 2**20, "16.8 MB"),
                                    (80 * 10**9, "80 GB"), (350e9, "350 GB"),
                                    (2.1e12, "2.1 TB"), (-2048, "-2.05 kB")])
def test_format_bytes_uses_decimal_units_and_three_digits(n, text):
    assert format_bytes(n) == text


def test_gb_is_ten_to_the_ninth():
    assert GB == 1_000_000_000
