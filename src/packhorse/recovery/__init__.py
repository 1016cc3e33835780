"""Failure recovery: the stalled-task monitor and circuit breakers (``monitor``,
``breakers``), the reconciler (``reconciler``), service health (``health``), the resilient
service loop (``loop``) and the I5 owner map (``owners``). Import the submodules directly."""
