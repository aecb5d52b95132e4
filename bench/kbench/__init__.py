"""Kestrel's benchmark suite, as modules; bench/run.py is the entry point."""
