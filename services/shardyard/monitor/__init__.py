"""The monitor service."""
