"""The operator's tools: ``launcher status`` and ``launcher logs``, read from a job's log dir alone."""
