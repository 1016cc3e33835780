"""Managers find work in the database and create operations for it, idempotently.

One module per stage; :mod:`.policy` holds the archive and deletion rules they share.
Every manager is a function ``manage(ctx, session) -> int`` returning how many operations
(or packages) it created; they derive everything from the database, so a lost dispatch is
found again on the next cycle.
"""
