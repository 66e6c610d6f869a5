"""The contract between the two halves of ptdash, shared by the engine and the dashboard.

Standard library only: the terminal side imports this package and nothing else of the
training side, so it never pulls in torch. What lives here is everything both halves
must agree on:

- ``protocol`` / ``wire``: the messages on the control socket; their JSON encoding and framing;
- ``limits``: the live settings' ranges and the one check of a command or a typed value;
- ``config``: the run's typed configuration (``RunConfig``) and run.json (``RunInfo``);
- ``store`` / ``reader`` / ``series_queries`` / ``rows`` / ``decimate``: the metrics store's
  writer, its reader (plain reads; series decimated for a chart; rows streamed for exports
  and summaries), and the min/max decimation writer and reader both use;
- ``rundir`` / ``perms``: a run's directory and the per-user registry of runs; who may
  read a run (private, or shared with a group) and the modes every writer uses;
- ``transport`` / ``client`` / ``private``: the Unix-socket server (engine), its client
  (dashboard, ``ptdash ctl``), and the private directory and peer checks they rely on;
- ``numbers``, ``exits``, ``throttle``: finite values, moving averages and safe JSON; exit
  codes in words; a budget for repeated log lines.
"""

__version__ = "0.1.0"
"""The ptdash version (one place: ``pyproject.toml`` reads it from here)."""
