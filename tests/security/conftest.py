"""The security tests use the test bed's shared fixtures (tests/conftest.py, from ``tests.helpers.bed``)."""

from __future__ import annotations
