"""Read-only looks at this machine: interfaces, ports, GPUs, files named by users."""
