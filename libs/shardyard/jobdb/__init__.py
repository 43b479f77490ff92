"""The job accounting database (as Slurm's slurmdbd is to ``sacct``): one row per job, written by the accounting
service (``services/shardyard/accounting``) and read by ``shardyard history`` and the monitor's ``/api/history``.

- ``record``: the row (:class:`~shardyard.jobdb.record.JobRecord`) and its columns, as JSON and CSV;
- ``query``: the filters a reader asks with (``--since``, ``--state``, ``--job``), parsed once for both readers;
- ``store``: the seam: ``open_store(url)`` gives SQLite (``sqlite:///path``, the default: ``RUN_DIR/accounting.db``)
  or PostgreSQL (``postgresql://...``), both behind one small ``Store`` protocol; the SQL lives in ``sql``, each
  back end in ``sqlite`` and ``postgres``, and ``urls`` says which URL names what.

The database is a view of the lifecycle log, not a second source of truth: the service rebuilds it from the log on
every start, by idempotent upserts, and keeps what the log has forgotten (an embedded broker's memory is gone after
``shardyard down``; the rows are not).
"""
