"""The TCP connections a service holds, counted in its network namespace's /proc/net/tcp and tcp6 as
`ss -Htn state established ( sport = :PORT )` counts them. Read from the kernel's tables, not from the
server, so every stack is counted the same way, and no ss is needed (a service image has none)."""

# The files to read in the service's namespace, in this order (a container's `cat` takes both).
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_ESTABLISHED = "01"  # the kernel's TCP_ESTABLISHED, the "st" column in hex


def established(tables: str, port: int) -> int:
    """How many rows of `tables` (the text of TABLES, header lines included) are ESTABLISHED
    connections whose local port is `port`: the server's side of its clients' connections."""
    local_port = f":{port:04X}"
    count = 0
    for line in tables.splitlines():
        fields = line.split()
        # sl local_address rem_address st ...; the header's first field is "sl".
        if len(fields) > 3 and fields[0] != "sl" and fields[3] == _ESTABLISHED:
            count += fields[1].endswith(local_port)
    return count
