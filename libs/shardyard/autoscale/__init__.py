"""Node providers: what an autoscaler adds nodes through and removes them by (``provider``), and the providers."""
