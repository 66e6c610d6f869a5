"""The terminal side of ptdash: the `ptdash` command and the Textual dashboard. Never imports torch."""
