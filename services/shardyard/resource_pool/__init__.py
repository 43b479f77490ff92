"""The resource-pool service."""
