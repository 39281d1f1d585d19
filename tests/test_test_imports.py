"""No module imports a test module (``test_*.py`` or ``conftest.py``): what tests share lives in helper modules.

.importlinter keeps the test folders apart and ``tests.helpers`` below them (tests/sdk/test_import_contracts.py
sees each contract fail), but a contract cannot name "every test module": its wildcards stand for whole module
names only. This checks that one rule on import-linter's own import graph (grimp), sees it fail on a planted
import, and checks that the folders' independence contract lists every test folder.
"""

from __future__ import annotations

import configparser
import uuid
from pathlib import Path

import grimp
import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def is_test_module(module: str) -> bool:
    name = module.rsplit(".", 1)[-1]
    return name.startswith("test_") or name == "conftest"


def imports_of_test_modules(package: str) -> list[str]:
    """Every import of a test module in ``package``, as ``importer -> imported``."""
    graph = grimp.build_graph(package, cache_dir=None)
    return sorted(f"{importer} -> {imported}" for importer in graph.modules
                  for imported in graph.find_modules_directly_imported_by(importer) if is_test_module(imported))



def test_no_module_imports_a_test_module() -> None:
    assert imports_of_test_modules("tests") == []


def test_a_planted_import_of_a_test_module_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = f"planted_{uuid.uuid4().hex[:8]}"
    (tmp_path / package / "folder").mkdir(parents=True)
    for module, source in {"__init__.py": "", "conftest.py": "", "helpers.py": "",
                           "folder/__init__.py": "", "folder/test_a.py": "VALUE = 1\n",
                           "folder/test_b.py": f"from {package}.folder import helpers\n",
                           "folder/helpers.py": ""}.items():
        (tmp_path / package / module).write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert imports_of_test_modules(package) == []
    (tmp_path / package / "helpers.py").write_text(f"from {package} import conftest\n")
    (tmp_path / package / "folder" / "test_b.py").write_text(f"from {package}.folder.test_a import VALUE\n")
    assert imports_of_test_modules(package) == [f"{package}.folder.test_b -> {package}.folder.test_a",
                                            f"{package}.helpers -> {package}.conftest"]


def test_the_independence_contract_lists_every_test_folder() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    listed = config["importlinter:contract:test-folders-independent"]["modules"].split()
    folders = [f"tests.{d.name}" for d in TESTS.iterdir() if (d / "__init__.py").exists() and d.name != "helpers"]
    assert sorted(listed) == sorted(folders)
