"""A queue and its faces: enqueue, the pull API and leases, admin and listings, the worker registry
and task table, events, unique jobs, coalescing and sharding.

May import: ``_model``, ``_store``.
"""
