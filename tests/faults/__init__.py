import pytest

# The torture runs' invariant checks live in a helper module: rewrite its asserts too, so a failure shows
# the values compared (pytest rewrites only test modules and conftest.py by itself).
pytest.register_assert_rewrite("tests.faults.torture")
