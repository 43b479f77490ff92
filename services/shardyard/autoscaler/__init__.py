"""The autoscaler service: capacity signals to a node provider (``shardyard.autoscale``)."""
