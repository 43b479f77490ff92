"""The queue service."""
