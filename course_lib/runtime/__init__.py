"""Plumbing: the launcher that runs a file on several processes, and the worker helper."""
