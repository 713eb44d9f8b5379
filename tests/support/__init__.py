"""Helpers the tests share (test-only code: nothing here ships in the package). Tests import
from here, never from conftest or from another test module."""
