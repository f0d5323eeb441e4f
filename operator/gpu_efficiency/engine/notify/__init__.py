"""Notifications: what the engine decides to announce to a policy's sinks (``messages``): pod
reclaims and warnings, fault events. How they are encoded and sent lives beside the sender
(``actuators/notify/``).
"""
