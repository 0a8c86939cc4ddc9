"""Boxes: where commands run (this machine, SSH, a cluster), the tunnel, what a box is."""
