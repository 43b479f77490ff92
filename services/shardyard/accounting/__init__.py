"""The accounting service: every job's record, folded from the lifecycle log, in the accounting database."""
