class LaunchError(Exception):
    """Bad input from the user: shown as one sentence, exit code 2, nothing started."""

    exit_code = 2
