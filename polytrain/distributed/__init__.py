"""Processes and machines: the cluster a process belongs to, launching, worker logs,
the watchdog."""
