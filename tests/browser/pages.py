"""Driving the run browser's pages in Chromium, and the ``start_ui`` fixture's type."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

StartUI = Callable[..., str]

WAIT = 60.0  # seconds for the page to show what the API server has: it polls every 2 s


def until(chrome: webdriver.Remote, condition: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    # The pages redraw their tables every poll: an element found a moment ago may be gone.
    return WebDriverWait(chrome, timeout, poll_frequency=0.2, ignored_exceptions=[StaleElementReferenceException]
                         ).until(lambda _: condition(), message=f"the page never showed {what}")


def rows(chrome: webdriver.Remote, table: str) -> list[dict[str, Any]]:
    """A table's rows as they are now, read in one go: each row's data attributes and its cells' text."""
    return list(chrome.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' tbody tr')]"
        ".map(r => ({data: {...r.dataset}, cells: [...r.cells].map(c => c.innerText)}))", f"#{table}"))


def open_link(chrome: webdriver.Remote, name: str) -> None:
    """Click the list's link to run ``name`` (again if the list was redrawn under the click)."""
    def click() -> bool:
        chrome.find_element(By.LINK_TEXT, name).click()
        return True

    until(chrome, click, f"a link to {name}")
    until(chrome, lambda: "/runs/" in chrome.current_url, f"{name}'s page")


def listed(chrome: webdriver.Remote) -> set[str]:
    return {row["data"].get("run", "") for row in rows(chrome, "runs")}


def text(chrome: webdriver.Remote, selector: str) -> str:
    return str(chrome.find_element(By.CSS_SELECTOR, selector).text)


def confirm(chrome: webdriver.Remote) -> str:
    """Accept the page's confirmation; its question."""
    alert = WebDriverWait(chrome, 10).until(lambda c: c.switch_to.alert)
    question = str(alert.text)
    alert.accept()
    return question


def answer(chrome: webdriver.Remote, reply: str) -> str:
    """Answer the page's prompt with ``reply``; its question."""
    alert = WebDriverWait(chrome, 10).until(lambda c: c.switch_to.alert)
    question = str(alert.text)
    alert.send_keys(reply)
    alert.accept()
    return question
