"""What the test suite needs besides aioqueue itself, one module per concept.

- ``waiting``: ``wait_until``, the way tests wait for a condition (never sleep, then assert);
- ``apps``: Apps for tests (``open_app``, ``unique_prefix``) and for the test apps that worker
  processes run (``app_from_env``);
- ``server``: the server's view: its clock (``server_ms``), connections by client name
  (``clients_named``, ``blocked_in``), replies as text, retrying raw clients;
- ``invariants``: the one invariant checker (I1): ``check_records`` / ``check_invariants``;
- ``proxy``: ``ReplyDropProxy``, a TCP proxy that loses one reply after the server ran it;
- ``instrumented``: ``InstrumentedScripts`` and ``Gate``, to hold an in-process worker at one
  await point of the job path;
- ``processes``: real ``python -m aioqueue worker`` processes and what their tasks recorded.
- ``groups``: the ``xdist_group`` marks handed to xdist's scheduler (a pytest plugin).

The fixtures live in ``tests/conftest.py``, on top of the ``aioqueue.testing`` pytest plugin.
"""
