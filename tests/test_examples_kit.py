"""The testing kit's example (``examples/test_signup.py``): a user's test file, run by pytest
with only the installed plugin (pytest-asyncio in its strict mode), passes."""

from __future__ import annotations

from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "test_signup.py"


def test_the_testing_kits_example_passes(pytester: pytest.Pytester) -> None:
    pytester.makeini(
        "[pytest]\nasyncio_mode = strict\nasyncio_default_fixture_loop_scope = function\n"
    )
    pytester.makepyfile(test_signup=EXAMPLE.read_text())
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
