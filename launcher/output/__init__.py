"""Everything the launcher writes: worker logs, the console, reports, the state file, error files."""
