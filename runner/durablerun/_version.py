"""The project's version: the one place it is written.

pyproject.toml reads it (setuptools' dynamic version), the SDK reports it
(``durablerun.__version__``, ``durablerun --version``, the manifest of each
run), the operator's default runner image is tagged with it, and a test keeps
charts/durable-run/Chart.yaml's version and appVersion equal to it.
"""

__version__ = "0.1.0"
