"""The simulator's names and defaults that its command line shows (``shardyard simulate --help``), apart from the
engine and the policies, so that building the CLI's parser loads neither."""

POLICY_NAMES = ("shardyard", "fifo", "priority", "first-fit", "sjf-oracle")
DEFAULT_CHECKPOINT_S = 10.0
"""Simulated seconds a preempted gang spends checkpointing."""
