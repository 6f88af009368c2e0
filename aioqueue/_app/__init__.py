"""The App: configuration, tasks, batches and chains, schedules, the blocking producer, the running
job's context and result waiting.

May import: ``_model``, ``_store``, ``_queue``.
"""
