"""Blocking file IO, run only on the thread pools owned by the Disk actors."""
