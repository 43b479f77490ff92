"""Stragglers: the rank of a synchronous gang that holds the others back, found from the shards' progress
(``detector``)."""
