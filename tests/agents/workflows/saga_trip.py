"""A trip booking saga (tests/agents): the charge fails (trip) or the budget stops it (trip_on_budget),
and the bookings are compensated.

Every step appends to STEP_LOG; cancelling the flight waits for the file GO_FILE
(so a test can SIGKILL the run while that compensation is in flight).
"""

from __future__ import annotations

import os
import time
from typing import Any

from durablerun import DurableContext, NonRetryableError
from durablerun.agents import Saga


def _log(line: str) -> None:
    with open(os.environ["STEP_LOG"], "a") as f:
        f.write(line + "\n")


def book(what: str) -> str:
    _log(f"book {what}")
    return f"{what}-1"


def cancel(booking: str) -> None:
    _log(f"cancel {booking} started")
    if booking == "flight-1":
        deadline = time.monotonic() + 60
        while not os.path.exists(os.environ["GO_FILE"]) and time.monotonic() < deadline:
            time.sleep(0.01)
    _log(f"cancel {booking} done")


def charge() -> None:
    _log("charge")
    raise NonRetryableError("card declined")


async def trip(ctx: DurableContext, input: Any) -> Any:
    async with Saga(ctx) as saga:
        flight = await ctx.step("book-flight", book, "flight")
        saga.add("cancel-flight", cancel, flight)
        hotel = await ctx.step("book-hotel", book, "hotel")
        saga.add("cancel-hotel", cancel, hotel)
        await ctx.step("charge", charge)
    return "booked"


def pay() -> None:
    _log("charge")


async def trip_on_budget(ctx: DurableContext, input: Any) -> Any:
    """Each booking costs $1: with --max-cost 2 the charge is refused, and the bookings are undone."""
    async with Saga(ctx) as saga:
        flight = await ctx.step("book-flight", book, "flight")
        ctx.add_cost(usd=1)
        saga.add("cancel-flight", cancel, flight)
        hotel = await ctx.step("book-hotel", book, "hotel")
        ctx.add_cost(usd=1)
        saga.add("cancel-hotel", cancel, hotel)
        await ctx.step("charge", pay)
    return "booked"
