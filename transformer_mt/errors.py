"""The one exception type for a user's mistake.

Library code raises :class:`MTError` with a one-line message that names the file, line or key at
fault and says what to do. The CLI prints that line and exits with code 1, without a traceback.
Anything else that escapes is a bug and keeps its traceback.
"""


class MTError(Exception):
    """A user-facing error: bad input, a missing file, a wrong config key."""
