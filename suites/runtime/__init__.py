"""Suites for the runtime mechanisms (``runtime/``)."""
