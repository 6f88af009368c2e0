"""The consumer pool: fetchers, the run of one job, the background loops and the health endpoint.

May import: ``_model``, ``_store``, ``_queue``, ``_app``.
"""
