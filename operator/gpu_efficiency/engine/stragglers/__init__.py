"""Stragglers: the one slow GPU that holds back a whole synchronous job.

- ``jobgroups``: which pods form one job (their top owner), the group a GPU is compared within;
- ``evaluate``: each GPU against its group's median, the straggler report and its quarantine.
"""
