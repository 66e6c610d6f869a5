"""What each tab shows, one module per tab, named as the tab.

Pure functions and state from RunState to Rich renderables (no Textual): the widgets in
``widgets/`` only place and draw what these return, so every tab's content is tested
without an app.
"""
