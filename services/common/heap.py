"""The objects a server makes while it starts, moved out of the cyclic garbage collector's sight.

CPython's full collection walks every tracked object in the process, and how often it runs grows with
the objects each request allocates and keeps past a younger collection. A request of 1,000 records
keeps thousands of dicts alive while it is built or parsed, so full collections come often, and each
walks the framework's modules and the start-up heap too (about 92,000 objects with aiohttp, Quart and
grpc imported). A record then cost a server 3-4x what it costs at 100 records, and that cost moved with
the size of the heap, which is the framework's, the lab's pool and the user's own application, not the
protocol's (measured: docs/measurement.md, "The garbage collector and the start-up heap").

gc.freeze() moves every object that exists once the server accepts into a permanent generation that
collections skip, as pre-fork servers do to keep pages shared: what a request then pays the collector
for is the objects it makes itself. GC_FREEZE=0 serves with the default collector instead.
"""

import gc

FROZEN, DEFAULT = "freeze", "default"


def freeze_startup(freeze: bool) -> None:
    """Once the server accepts: collect start-up's garbage, then freeze what is left (with freeze)."""
    if freeze:
        gc.collect()
        gc.freeze()


def describe(freeze: bool) -> str:
    """The collector setting a listening line names: "freeze" or "default"."""
    return FROZEN if freeze else DEFAULT
