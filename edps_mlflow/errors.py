"""The one exception type that the command line turns into a one-line error."""


class EdpsError(Exception):
    """A user-facing error: bad input, missing data, an unusable store. Printed as one line, exit code 2."""

    exit_code = 2
    ends_at_once = False  # the process ends right after its line, without its teardown (process_settings.end_with)
