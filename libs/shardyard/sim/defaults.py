"""The simulator's names and defaults that its command line shows (``shardyard simulate --help``), apart from the
engine and the policies, so that building the CLI's parser loads neither."""

POLICY_NAMES = ("shardyard", "fifo", "priority", "first-fit", "sjf-oracle", "shardyard-one-queue")
OWN_POLICY = "shardyard"
"""The project's own policy, the one the verdict compares with every other policy run."""
ONE_QUEUE = "shardyard-one-queue"
"""The core without the queues file's quotas (one queue, as without a file): what the quotas cost or gain. Run by
default only beside a queues file."""
DEFAULT_CHECKPOINT_S = 10.0
"""Simulated seconds a preempted gang spends checkpointing."""
