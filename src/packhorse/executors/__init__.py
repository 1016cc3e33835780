"""Executors decide *where* an operation runs; what runs is :mod:`packhorse.engine.pipeline`'s.

:mod:`.local`: the embedded runner, operations in local worker processes (``packhorse run``).
:mod:`.celery_app`: the distributed executor, operations on Celery queues per (site, data
location, operation kind) (``packhorse manager`` / ``worker``).
"""
