"""Helpers the tests share (test-only code: nothing here ships in the package). Tests import
from here, never from conftest or from another test module."""

# The bad-input suite's figures travel in each case's report under this name
# (tests/badinput/conftest.py puts them, tests/conftest.py sums and prints them).
BADINPUT_FIGURES = "badinput-figures"
