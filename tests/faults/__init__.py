import pytest

# The torture runs' invariant checks and the pause driver live in helper modules: rewrite their asserts too, so a
# failure shows the values compared (pytest rewrites only test modules and conftest.py by itself).
pytest.register_assert_rewrite("tests.faults.torture", "tests.faults.pausing")
