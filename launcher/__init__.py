"""Start one training worker per GPU (or CPU slot), keep their logs, stop them together.

The launcher itself (``python -m launcher``) never imports torch; only the
worker-side modules ``launcher.runtime`` and ``launcher.fleet`` do.
"""

__version__ = "0.1.0"
