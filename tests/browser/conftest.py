"""The run browser's fixtures: one Chromium per module (Debian's, through chromedriver, headless, loopback only)
and ``start_ui``, which serves ``kubectl durablerun ui`` as a given kubeconfig's user."""

from __future__ import annotations

import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver

from durablerun_testbed import binaries, chromium, procs
from durablerun_testbed.testbed import TestBed
from tests.browser.pages import StartUI
from tests.helpers.session import SESSION_ID


@pytest.fixture(scope="module")
def chromedriver(testbed_root: Path) -> Iterator[chromium.Chromedriver]:
    driver = chromium.Chromedriver(testbed_root / "chromium", SESSION_ID).start()
    yield driver
    driver.stop()


@pytest.fixture(scope="module")
def chrome(chromedriver: chromium.Chromedriver) -> Iterator[webdriver.Remote]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium.CHROMIUM)
    for argument in chromium.chromium_arguments(chromedriver.new_profile()):
        options.add_argument(argument)
    browser = webdriver.Remote(command_executor=chromedriver.url, options=options)
    yield browser
    browser.quit()


@pytest.fixture
def start_ui(testbed: TestBed, testbed_root: Path) -> Iterator[StartUI]:
    """``start_ui(kubeconfig, *flags)``: `kubectl durablerun ui` as that kubeconfig's user; returns its URL."""
    started: list[procs.ManagedProcess] = []

    def start(kubeconfig: Path, *flags: str) -> str:
        port = procs.free_port()
        process = procs.ManagedProcess(
            "ui", [sys.executable, "-m", "durablerun.kubectl", "--kubeconfig", str(kubeconfig), "ui",
                   "--port", str(port), *flags],
            log_path=testbed_root / "logs" / f"ui-{uuid.uuid4().hex[:6]}.log",
            env={**testbed.env(), "KUBECTL": str(binaries.kubectl())}, testbed_id=SESSION_ID)
        started.append(process)
        url = f"http://127.0.0.1:{port}/"

        def up() -> bool:
            process.check_alive()
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    return bool(response.status == 200)
            except OSError:
                return False

        procs.wait_for(up, timeout=30, what="the run browser's first page")
        return url

    yield start
    for process in started:
        process.stop()
