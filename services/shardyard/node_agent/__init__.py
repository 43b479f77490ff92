"""The node-agent service."""
