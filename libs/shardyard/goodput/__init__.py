"""A job's goodput ledger (where its time went: queued, productive, recovery, recomputed, notice, degraded,
straggler) and its effective-training-time ratio: :mod:`~shardyard.goodput.ledger` holds the ledger,
:mod:`~shardyard.goodput.fold` folds one job's events into it and defines each part."""

from shardyard.goodput.fold import AttemptMarks, GoodputFold, Segment, ledger_of_events
from shardyard.goodput.ledger import PARTS, Ledger, Part, ledger_of

__all__ = ["PARTS", "AttemptMarks", "GoodputFold", "Ledger", "Part", "Segment", "ledger_of", "ledger_of_events"]
