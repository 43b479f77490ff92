"""Which network interface carries the node's advertised address, so that gloo and NCCL listen there.

gloo picks its interface from the host name (whatever address it resolves to) unless ``GLOO_SOCKET_IFNAME`` names
one, and NCCL from its own ranking unless ``NCCL_SOCKET_IFNAME`` does; neither takes an address. The agent finds the
interface the advertised address belongs to (or, failing an exact match, the one whose subnet holds it: 127.0.0.2 is
on ``lo``) and gives its shards those variables (:attr:`.environment.RunnerOptions.socket_ifname`). IPv4 only;
an address no interface holds leaves the libraries their own choice.

:func:`interface_of` is pure; :func:`local_interfaces` asks the kernel (Linux ``SIOCGIFADDR``/``SIOCGIFNETMASK``).
"""

import contextlib
import fcntl
import ipaddress
import socket
import struct
from collections.abc import Mapping, Sequence
from typing import Final

_SIOCGIFADDR: Final = 0x8915
_SIOCGIFNETMASK: Final = 0x891B

Interfaces = Mapping[str, Sequence[ipaddress.IPv4Interface]]
"""Interface name -> its IPv4 addresses with their prefixes."""


def interface_of(address: str, interfaces: Interfaces) -> str | None:
    """The interface holding ``address`` (an IPv4 address), else the one whose subnet holds it (the narrowest);
    None when there is neither, or ``address`` is not an IPv4 address."""
    try:
        wanted = ipaddress.IPv4Address(address)
    except ValueError:
        return None
    for name in sorted(interfaces):
        if any(iface.ip == wanted for iface in interfaces[name]):
            return name
    holding = [
        (iface.network.prefixlen, name)
        for name in sorted(interfaces)
        for iface in interfaces[name]
        if wanted in iface.network
    ]
    return max(holding, key=lambda found: found[0])[1] if holding else None


def local_interfaces() -> dict[str, list[ipaddress.IPv4Interface]]:
    """This host's interfaces with their primary IPv4 address; those without one are left out."""
    found: dict[str, list[ipaddress.IPv4Interface]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            with contextlib.suppress(OSError):
                address = socket.inet_ntoa(fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)[20:24])
                netmask = socket.inet_ntoa(fcntl.ioctl(probe.fileno(), _SIOCGIFNETMASK, request)[20:24])
                found[name] = [ipaddress.IPv4Interface(f"{address}/{netmask}")]
    return found


def advertised_interface(address: str) -> str | None:
    """The interface for the agent's ``address`` setting (a host name is resolved first); None when none holds it."""
    try:
        resolved = socket.gethostbyname(address)
    except OSError:
        return None
    return interface_of(resolved, local_interfaces())
