"""A workflow module that raises while being imported."""

raise RuntimeError("config file missing")
