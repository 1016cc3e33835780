"""Notifications: the outbox (written with the state change) and, later, its delivery.

``outbox`` is the only way any component queues a notification (DESIGN.md "Architecture").
"""

from packhorse.notify.outbox import enqueue, render_error_context

__all__ = ["enqueue", "render_error_context"]
