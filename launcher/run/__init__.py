"""Running one node's workers: the only layer with subprocesses, signals, ctypes and cgroups."""
