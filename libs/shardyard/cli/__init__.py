"""The ``shardyard`` command line."""
