"""A code migration that waits for a human to approve the plan.

    cd examples
    durablerun run code_migration:migrate --run-id m1 --input '{"repo": "acme/api", "files": 6}'
    # -> exit 4: Waiting for event 'plan-approval'
    durablerun inspect --run-id m1
    durablerun send-event --run-id m1 plan-approval '{"approved": true, "by": "dana"}'
    durablerun run code_migration:migrate --run-id m1          # resumes, applies the plan

A rejected plan ends the run with a summary; no approval within the timeout
raises EventTimeout, handled below by escalating.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from durablerun import DurableContext, EventTimeout

APPLIED: list[str] = []  # side effects in this process (tests read it)


def scan(repo: str, files: int) -> list[str]:
    return [f"{repo}/src/module_{i}.py" for i in range(files)]


def propose(path: str) -> dict[str, Any]:
    return {"path": path, "patch": f"- import old_http\n+ import new_http  # {path}"}


def apply_patch(ctx: DurableContext, change: dict[str, Any]) -> str:
    # The idempotency key is stable across retries and resumes: a real VCS API
    # would use it to refuse a duplicate commit.
    key = ctx.idempotency_key()
    APPLIED.append(key)
    return f"committed {change['path']} ({key})"


def run_tests(repo: str) -> dict[str, Any]:
    return {"repo": repo, "passed": True}


async def migrate(ctx: DurableContext, input: dict[str, Any]) -> dict[str, Any]:
    repo = input["repo"]
    paths = await ctx.step("scan", scan, repo, int(input.get("files", 4)))
    changes = await ctx.gather(*[ctx.step(f"propose:{p}", propose, p) for p in paths])
    try:
        approval = await ctx.wait_for_event(
            "plan-approval", timeout=timedelta(seconds=float(input.get("approval_timeout", 172800))))
    except EventTimeout:
        await ctx.step("escalate", lambda: f"no approval for {repo}: paged the owners")
        return {"repo": repo, "status": "escalated"}
    if not approval.get("approved"):
        return {"repo": repo, "status": "rejected", "by": approval.get("by")}
    commits = []
    for change in changes:
        commits.append(await ctx.step(f"apply:{change['path']}", apply_patch, ctx, change))
    # A step added while runs were in flight: runs already past this point when
    # it shipped replay without it; every other run takes it.
    if ctx.patched("run-tests-after-apply"):
        tests = await ctx.step("tests", run_tests, repo)
    else:
        tests = None
    return {"repo": repo, "status": "migrated", "commits": len(commits), "tests": tests,
            "approved_by": approval.get("by")}
