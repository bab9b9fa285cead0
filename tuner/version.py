"""The tuner's version, stamped on every export (a base module: any room may read it)."""

__version__ = "0.1.0"
