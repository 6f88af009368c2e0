"""``python -m aioqueue``: the command line, its output formats and the worker supervisor.

May import: every other folder, ``aioqueue.dashboard`` and ``aioqueue.metrics``.
"""
