"""A workflow module that raises while being imported (a bad deploy of the workflow's code)."""

raise RuntimeError("config.yaml not found: the workflow module cannot start")


async def run(ctx: object, input: object) -> None:  # never reached
    return None
