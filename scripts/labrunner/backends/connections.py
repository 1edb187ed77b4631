"""The TCP connections a service holds, counted in its network namespace's /proc/net/tcp and tcp6 as
`ss -Htn state established ( sport = :PORT )` counts them. Read from the kernel's tables, not from the
server, so every stack is counted the same way, and no ss is needed (a service image has none)."""

from collections.abc import Collection
from pathlib import Path

# The files to read in the service's namespace, in this order (a container's `cat` takes both).
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
# The kernel's TCP states (the "st" column, in hex): a connection both ends hold, and one the client
# has closed while the server still holds it.
ESTABLISHED, CLOSE_WAIT = "01", "08"


def established(tables: str, port: int, states: Collection[str] = (ESTABLISHED,)) -> int:
    """How many distinct connections in `tables` (the text of TABLES, header lines included) have
    `port` as their local port, in one of `states` (ESTABLISHED by default): the server's side of its
    clients' connections. The kernel serves the file a page at a time, so a read while sockets come and
    go can list a row twice (34 of 2,764 reads beside a busy test run): a connection is its address
    pair, counted once."""
    local_port = f":{port:04X}"
    pairs = set()
    for line in tables.splitlines():
        fields = line.split()
        # sl local_address rem_address st ...; the header's first field is "sl".
        if len(fields) > 3 and fields[0] != "sl" and fields[3] in states and fields[1].endswith(local_port):
            pairs.add((fields[1], fields[2]))
    return len(pairs)


def seen_by(pid: int, port: int, states: Collection[str] = (ESTABLISHED,)) -> int | None:
    """established() in the namespace of process `pid`, read through its own /proc/<pid>/net; None
    once it has ended."""
    try:
        tables = "".join(
            (Path(f"/proc/{pid}") / table.removeprefix("/proc/")).read_text() for table in TABLES
        )
    except OSError:
        return None
    return established(tables, port, states)
