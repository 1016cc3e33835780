"""Executors run operations: :mod:`.local` (thread pool, embedded mode)."""
