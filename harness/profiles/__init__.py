"""Boxes and runtime profiles as data, and the profiles shipped with the harness."""
