"""Benchmarks of the tuner's own measurement: not part of the default test run.

Each module runs as ``.venv/bin/python -m tests.benchmarks.<name>`` and merges its section into
``reports/measurement.md`` and ``reports/measurement.json`` (see ``_report``), or writes its own
report; every section and report carries the stamp of its run (``stamp``). ``python -m
tests.benchmarks`` lists them all and runs one by name, or every report's with ``all``.
"""
