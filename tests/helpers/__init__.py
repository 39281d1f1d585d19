"""What more than one test folder uses: the test bed's shared fixtures, runs and their workflows, journal checks.

The tests' counterpart of Temporal's ``tests/helpers`` and controller-runtime's ``envtest``. The rules, checked
by import-linter (.importlinter, ``make lint``: contracts test-folders-independent and tests-layers) and by
tests/test_test_imports.py:

- a test folder (tests/operator, tests/faults, ...) imports no other test folder, only ``tests.helpers``;
- ``tests.helpers`` imports no test folder;
- no module imports a test module (``test_*.py`` or ``conftest.py``): what two test modules share lives in a
  helper module of their folder, or here when two folders share it.

Shared pytest fixtures are defined in ``bed.py`` and provided to every folder by tests/conftest.py.
"""

from pathlib import Path

import pytest

# Most checks live here, not in test modules: rewrite their asserts as pytest does a test module's, so a failure
# shows the values compared, not a bare AssertionError (pytest rewrites only test modules and conftest.py itself).
pytest.register_assert_rewrite(*(f"{__name__}.{path.stem}" for path in Path(__file__).parent.glob("*.py")
                                 if path.stem != "__init__"))
