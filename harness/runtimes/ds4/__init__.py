"""ds4 (the seed-004 runtime) on this machine: its CPU build and a model of its fixed shape."""
