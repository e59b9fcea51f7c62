"""The launcher's own logger (``log``) and the form of its messages: ``launcher: warning: ...``.

Its handler, which writes them to the console, is set up by ``console.setup_messages``.
"""

from __future__ import annotations

import logging

log = logging.getLogger("launcher")


class MessageFormat(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno == logging.INFO else record.levelname.lower() + ": "
        return f"launcher: {level}{record.getMessage()}"
