"""Puts the repository root on sys.path so tests can import ``bench`` helpers."""
