"""Notifications sent: the policy's sinks posted to, off the cycle's thread (``delivery``).
What to announce is the engine's decision (``engine/notify/``).
"""
