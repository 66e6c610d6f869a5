"""e2e tests (see tests/conftest.py for the tiers)."""
