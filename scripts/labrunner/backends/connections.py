"""The TCP connections a service holds, counted in its network namespace's /proc/net/tcp and tcp6 as
`ss -Htn state established ( sport = :PORT )` counts them. Read from the kernel's tables, not from the
server, so every stack is counted the same way, and no ss is needed (a service image has none)."""

from pathlib import Path

# The files to read in the service's namespace, in this order (a container's `cat` takes both).
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_ESTABLISHED = "01"  # the kernel's TCP_ESTABLISHED, the "st" column in hex


def established(tables: str, port: int) -> int:
    """How many distinct ESTABLISHED connections in `tables` (the text of TABLES, header lines
    included) have `port` as their local port: the server's side of its clients' connections. The
    kernel serves the file a page at a time, so a read while sockets come and go can list a row twice
    (34 of 2,764 reads beside a busy test run): a connection is its address pair, counted once."""
    local_port = f":{port:04X}"
    pairs = set()
    for line in tables.splitlines():
        fields = line.split()
        # sl local_address rem_address st ...; the header's first field is "sl".
        if (
            len(fields) > 3
            and fields[0] != "sl"
            and fields[3] == _ESTABLISHED
            and fields[1].endswith(local_port)
        ):
            pairs.add((fields[1], fields[2]))
    return len(pairs)


def seen_by(pid: int, port: int) -> int | None:
    """established() in the namespace of process `pid`, read through its own /proc/<pid>/net; None
    once it has ended."""
    try:
        tables = "".join(
            (Path(f"/proc/{pid}") / table.removeprefix("/proc/")).read_text() for table in TABLES
        )
    except OSError:
        return None
    return established(tables, port)
