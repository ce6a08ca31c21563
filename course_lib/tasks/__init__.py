"""Data sets and models, made by code from a seed."""
