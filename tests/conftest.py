"""Shared pytest settings: every test is bounded (pytest-timeout in pyproject.toml)."""
