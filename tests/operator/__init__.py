import pytest

# decide's table helpers (``apply`` checks a plan's test ops) moved here from a test module: rewrite their asserts
# as pytest did there, so a failure still shows the values compared.
pytest.register_assert_rewrite("tests.operator.run_bodies")
