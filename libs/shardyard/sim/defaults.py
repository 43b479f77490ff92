"""The simulator's names and defaults that its command line shows (``shardyard simulate --help``), apart from the
engine and the policies, so that building the CLI's parser loads neither."""

POLICY_NAMES = ("shardyard", "fifo", "priority", "first-fit", "sjf-oracle", "shardyard-order", "shardyard-one-queue")
OWN_POLICY = "shardyard"
"""The project's own policy, the one the verdict compares with every other policy run."""
ONE_QUEUE = "shardyard-one-queue"
"""The core without the queues file's quotas (one queue, as without a file): what the quotas cost or gain. Run by
default only beside a queues file."""
ORDER_VICTIMS = "shardyard-order"
"""The core with ``Policy(victims="order")``: the victims taken in the victim order, as before lost work was counted
(the shardyard policy takes the gangs that lose least)."""
DEFAULT_CHECKPOINT_S = 10.0
"""Simulated seconds a gang takes to write a checkpoint on a preemption notice."""
DEFAULT_CHECKPOINT_EVERY_S = 1800.0
"""Simulated seconds of progress between a gang's periodic checkpoints."""
DEFAULT_NOTICE_S = 30.0
"""Simulated seconds from a preemption to its deadline (the scheduler's ``preempt_deadline_s``)."""
DEFAULT_NOTICE_SHARE = 1.0
"""The share of the jobs whose code checkpoints on a preemption notice."""
DEFAULT_RESTART_S = 60.0
"""Simulated seconds each restart after a preemption holds the gang's GPUs without progress."""
DEFAULT_RESIZE_S = 5.0
"""Simulated seconds each resize of an elastic gang (a re-formation from live state) holds it without progress."""
