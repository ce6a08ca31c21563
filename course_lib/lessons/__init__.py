"""Helpers for the notebooks: pictures, widgets, measurements and the lessons' small labs."""
