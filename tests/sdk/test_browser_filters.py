"""The run browser's list filters and run summaries (pure logic; the browser itself is tested in tests/browser)."""

from __future__ import annotations

from typing import Any

import pytest

from durablerun import api
from durablerun._private.tools import browser

NOW = api.parse_time("2026-01-02T00:00:00Z").timestamp()


def run(name: str, phase: str, *, labels: dict[str, str] | None = None, created: str = "2026-01-01T23:00:00Z",
        usd: str = "0") -> dict[str, Any]:
    return browser.summary({"metadata": {"namespace": "ns", "name": name, "labels": labels or {},
                                         "creationTimestamp": created},
                            "status": {"phase": phase, "cost": {"usd": usd, "tokens": 3}}})


RUNS = [run("a", "Waiting", labels={"team": "x", browser.QUEUE_LABEL: "gpu"}, usd="0.5"),
        run("b", "Running", labels={"team": "y"}, created="2025-12-01T00:00:00Z"),
        run("c", "Succeeded")]


@pytest.mark.parametrize(("query", "names"), [
    ({}, ["a", "b", "c"]),
    ({"phase": ["Waiting,Running"]}, ["a", "b"]),
    ({"label": ["team=y"]}, ["b"]),
    ({"label": ["team"]}, ["a", "b"]),
    ({"label": ["team=x, " + browser.QUEUE_LABEL]}, ["a"]),
    ({"queue": ["gpu"]}, ["a"]),
    ({"age": ["2h"]}, ["a", "c"]),
    ({"cost": ["0.25"]}, ["a"]),
    ({"q": ["NS/B"]}, ["b"]),  # any case, in namespace/name
    ({"q": ["ns c"]}, ["c"]),  # every word
    ({"q": ["ns z"]}, []),
])
def test_filters(query: dict[str, list[str]], names: list[str]) -> None:
    keep = browser.Filters(query)
    assert [r["name"] for r in RUNS if keep(r, NOW)] == names


@pytest.mark.parametrize(("query", "message"), [
    ({"phase": ["Sleeping"]}, "phase: Sleeping is not a phase"),
    ({"age": ["two hours"]}, "age: "),
    ({"cost": ["lots"]}, "cost: 'lots' is not a number"),
    ({"sort": ["age"]}, "sort: 'age' is not one of newest, oldest, name, cost, restarts"),
])
def test_a_bad_filter_names_its_field(query: dict[str, list[str]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        browser.Filters(query)


def test_summary_shows_what_the_list_needs() -> None:
    (a, *_) = RUNS
    assert (a["queue"], a["usd"], a["tokens"], a["parent"]) == ("gpu", "0.5", 3, "")


@pytest.mark.parametrize(("sort", "names"), [
    ("", ["a", "c", "b"]),  # newest first (a and c were created at the same time: then by name)
    ("oldest", ["b", "a", "c"]),
    ("name", ["a", "b", "c"]),
    ("cost", ["a", "b", "c"]),  # the highest first; ties by namespace and name
])
def test_the_list_sorts(sort: str, names: list[str]) -> None:
    watch = browser.RunWatch(None, all_namespaces=True)  # type: ignore[arg-type]  # never started: no kubectl
    watch.runs = {("ns", r["name"]): r for r in RUNS}
    page = watch.page(browser.Filters({"sort": [sort]} if sort else {}), 0)
    assert [r["name"] for r in page["runs"]] == names


def test_a_trace_url_needs_http_and_the_trace_id_and_a_runner_cannot_steer_the_link() -> None:
    from durablerun._private.tools import kubectl
    from durablerun._private.tools.arguments import UsageError

    with pytest.raises(UsageError, match=r"argument --trace-url: 'http://j/trace/' is not an http\(s\) URL with "
                                         r"\{traceID\} in it"):
        kubectl.build_parser().parse_args(["ui", "--trace-url", "http://j/trace/"])
    args = kubectl.build_parser().parse_args(["ui", "--trace-url", "https://j/trace/{traceID}"])
    linked = browser.Browser.__new__(browser.Browser)
    linked.trace_url = args.trace_url
    trace_id = api.trace_id("default/r")
    assert linked._trace_link({"status": {"traceID": trace_id}}) == f"https://j/trace/{trace_id}"
    assert linked._trace_link({"status": {"traceID": "../../admin"}}) == ""
    assert linked._trace_link({"status": {}}) == ""
