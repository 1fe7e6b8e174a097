"""Differential fuzzing against XLA CPU: random programs, hostile inputs stay in tests/test_hostile.py.

The fuzz modules import ``support`` as a top-level module like every test does; put
tests/ on the path so that ``python -m tests.fuzz.long_run`` finds it too.
"""
import os
import sys

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
