"""The operator tests' own fixtures: ``kubectl durablerun`` as a user runs it, and one operator for a whole module
(the test bed's shared fixtures come from tests/conftest.py).

A module that sets ``OPERATOR_PER_MODULE = True`` gets one operator for all its tests that ask for ``operator``
(the fixture: tests that never stop, restart, scrape or reconfigure it), instead of one each: starting an
operator takes 3 s on a quiet machine and 10 s in a busy suite. Each such test still has a namespace of its own,
made when the module starts (the operator watches exactly those) and deleted after the test, so no test sees
another's runs, pods, Events or Secrets. Tests that use ``start_operator`` are unaffected.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from durablerun_testbed.testbed import TestBed
from tests.helpers.bed import launch_operator
from tests.helpers.kubectl_plugin import Plugin
from tests.helpers.runs import Operator, create_namespaces
from tests.operator.ingress_bed import Ingress, run_ingress


@pytest.fixture
def plugin(testbed: TestBed, namespace: str, tmp_path: Path) -> Plugin:
    home = tmp_path / "home"
    home.mkdir()
    return Plugin(testbed, namespace, home)


@dataclass
class ModuleOperator:
    operator: Operator
    namespaces: dict[str, str]  # test id -> its namespace


def _shares_the_operator(request: pytest.FixtureRequest) -> bool:
    return bool(getattr(request.module, "OPERATOR_PER_MODULE", False)) and "operator" in request.fixturenames


@pytest.fixture(scope="module")
def module_operator(request: pytest.FixtureRequest, testbed: TestBed,
                    testbed_root: Path) -> Iterator[ModuleOperator]:
    """One operator watching a namespace for each of the module's tests that will run and ask for ``operator``."""
    tests = [item.nodeid for item in request.session.items
             if getattr(item, "module", None) is request.module and "operator" in getattr(item, "fixturenames", ())]
    namespaces = dict(zip(tests, create_namespaces(testbed, len(tests)), strict=True))
    try:
        operator = launch_operator(testbed, testbed_root, list(namespaces.values()))
        try:
            yield ModuleOperator(operator, namespaces)
        finally:
            operator.stop()
    finally:
        for name in namespaces.values():  # again, for those of tests that did not run (the rest are gone already)
            testbed.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def namespace(request: pytest.FixtureRequest, testbed: TestBed) -> Iterator[str]:
    """The test's own fresh namespace (tests/conftest.py's), or, for a test sharing its module's operator, the one
    made for it when the module started; deleted after the test."""
    if _shares_the_operator(request):
        shared: ModuleOperator = request.getfixturevalue("module_operator")
        name = shared.namespaces[request.node.nodeid]
    else:
        (name,) = create_namespaces(testbed, 1)
    yield name
    testbed.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def operator(request: pytest.FixtureRequest, namespace: str) -> Iterator[Operator]:
    """The test's operator, for tests that do not restart it: its module's (alive before and after the test, so a
    test that kills it fails itself, not the next one) or, without OPERATOR_PER_MODULE, one of its own."""
    if not _shares_the_operator(request):
        yield request.getfixturevalue("start_operator")()
        return
    shared: ModuleOperator = request.getfixturevalue("module_operator")
    shared.operator.process.check_alive()
    yield shared.operator
    shared.operator.process.check_alive()


@pytest.fixture
def ingress(testbed: TestBed, testbed_root: Path, namespace: str, tmp_path: Path,
            request: pytest.FixtureRequest) -> Iterator[Ingress]:
    """The webhook ingress as the chart deploys it, with the flags a test passes as its ``indirect`` parameter
    (else generous rate limits)."""
    yield from run_ingress(testbed, testbed_root, namespace, tmp_path,
                           getattr(request, "param", None) or ["--rate", "1000", "--burst", "2000"])
