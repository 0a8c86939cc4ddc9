"""Knob sweeps of the simulator: what varies, where its tasks run, and its ladder."""
