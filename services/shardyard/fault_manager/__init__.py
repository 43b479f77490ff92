"""The fault-manager service."""
