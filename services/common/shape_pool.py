"""The record pool's data for the shapes beside cars (numeric, text, nested), as the contract's JSON.

No serving code, like services.common.pool, which generates and caches every shape's pool through
these: one record per call of a seeded Faker, in a fixed order, so the same (size, seed) gives the
same records in any process. The JSON holds the proto's JSON names (timestamp_ms -> timestampMs);
numeric's int64 fields are JSON numbers (below 2**53, exact in any JSON reader) and its doubles carry
three decimals, nested's prices two, so that a checksum can read them as integers (round(x * 1000)).
"""

from typing import Any

from faker import Faker

# The proto's field names in the proto's order (proto/cars.proto; tests/unit/test_shapes.py holds them
# to the descriptor), as JSON names.
NUMERIC_INTS = (
    "id",
    "timestampMs",
    "sequence",
    "accountId",
    "quantity",
    "volume",
    "openInterest",
    "tradeCount",
)
NUMERIC_DOUBLES = ("price", "bid", "ask", "open", "high", "low", "close", "vwap")
TEXT_FIELDS = ("title", "author", "language", "slug", "body")
# A text record's body: about 1 KB of ASCII prose, cut at this many characters.
TEXT_BODY_CHARS = 1024
# A nested record's line items, at least and at most; its attributes, always.
NESTED_ITEMS = (2, 6)
NESTED_ATTRIBUTES = ("channel", "currency", "region")  # sorted: services.common.shapes.NestedRecord
_CHANNELS = ("web", "store", "phone", "partner")
_CURRENCIES = ("EUR", "USD", "GBP", "JPY")
_REGIONS = ("north", "south", "east", "west", "central")


def numeric_record(faker: Faker) -> dict[str, Any]:
    """A market tick: 8 non-negative int64 below 2**53, 8 positive doubles with three decimals."""
    rng = faker.random
    ints = (
        rng.randrange(1, 2**53),
        rng.randrange(1_600_000_000_000, 1_900_000_000_000),
        rng.randrange(0, 2**40),
        rng.randrange(1, 10_000_000),
        rng.randrange(1, 100_000),
        rng.randrange(0, 10**12),
        rng.randrange(0, 10**9),
        rng.randrange(0, 10**6),
    )
    price = rng.randrange(1_000, 10_000_000) / 1000
    doubles = [round(price * rng.uniform(0.95, 1.05), 3) for _ in NUMERIC_DOUBLES]
    return dict(zip(NUMERIC_INTS, ints, strict=True)) | dict(zip(NUMERIC_DOUBLES, doubles, strict=True))


def text_record(faker: Faker) -> dict[str, Any]:
    """An article: a title, an author, a language code, a slug and a body of TEXT_BODY_CHARS characters
    (Faker's lorem words drawn by its seeded random: its sentence and name providers would take
    seconds per thousand records)."""
    words = faker.get_words_list()
    rng = faker.random
    title_words = rng.choices(words, k=6)
    # 220 words of 4 to 8 letters and their spaces are always more than TEXT_BODY_CHARS characters.
    body = " ".join(rng.choices(words, k=220)).capitalize()
    return {
        "title": " ".join(title_words).capitalize(),
        "author": " ".join(word.capitalize() for word in rng.choices(words, k=2)),
        "language": faker.random_element(("en", "de", "fr", "es", "it", "nl")),
        "slug": "-".join(title_words),
        "body": body[:TEXT_BODY_CHARS],
    }


def nested_record(faker: Faker) -> dict[str, Any]:
    """An order: an id, 2 to 6 line items (sku, quantity, a price with two decimals), 3 attributes."""
    rng = faker.random
    items = [
        {
            "sku": faker.bothify("SKU-????-####").upper(),
            "quantity": rng.randrange(1, 50),
            "price": rng.randrange(50, 500_000) / 100,
        }
        for _ in range(rng.randint(*NESTED_ITEMS))
    ]
    attributes = {
        "channel": faker.random_element(_CHANNELS),
        "currency": faker.random_element(_CURRENCIES),
        "region": faker.random_element(_REGIONS),
    }
    return {"orderId": faker.bothify("ORD-##########"), "items": items, "attributes": attributes}
