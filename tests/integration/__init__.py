"""integration tests (see tests/conftest.py for the tiers)."""
