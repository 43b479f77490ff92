"""Ports on this host: one free to bind now, and waiting for one to listen."""

import socket
import time


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now. Another process may take it before ours binds it: whoever binds it retries."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout_s: float) -> bool:
    """Whether something listens on ``host:port`` within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    return False
