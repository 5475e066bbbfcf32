"""The test suite. It runs in a checkout: ``PROJECT_ROOT`` is that checkout (docs, test data)."""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
