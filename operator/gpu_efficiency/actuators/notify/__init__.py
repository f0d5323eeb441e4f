"""Notifications sent: the policy's sinks posted to, off the cycle's thread (``delivery``), in the
wire formats they speak (``wire``: CloudEvents 1.0 structured mode, Slack incoming-webhook JSON).
What to announce is the engine's decision (``engine/notify/``).
"""
