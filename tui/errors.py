"""``CliError``: how every ``ptdash`` subcommand reports a problem (one line and an exit status).

Its own module so that ``cli`` and the subcommand modules it imports (``ctl``) raise the
same class: ``python -m ptdash.tui.cli`` runs cli as ``__main__``, so a class defined
there would be a second, different one for every module that imported it.
"""

from __future__ import annotations


class CliError(Exception):
    """A problem to report as one line, with an exit status."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code
