"""The demo database: a tiny shop (customers, products, orders, order_items), the same on every machine.

It lets a new user try every SQL tool at once, and gives the tests a known schema with
foreign keys, a composite primary key, a unique column, defaults and CHECK constraints.
"""

from __future__ import annotations

from pathlib import Path

from .sqlite_db import create_file

__all__ = ["DEMO_SCHEMA", "create_demo_database", "demo_script"]

DEMO_SCHEMA = """
CREATE TABLE customers (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT NOT NULL UNIQUE,
    country TEXT NOT NULL DEFAULT 'FR',
    created_at TEXT NOT NULL DEFAULT (datetime('now'))
);
CREATE TABLE products (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    category TEXT NOT NULL,
    price REAL NOT NULL CHECK (price >= 0),
    stock INTEGER NOT NULL DEFAULT 0 CHECK (stock >= 0)
);
CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers (id) ON DELETE RESTRICT,
    ordered_at TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'new' CHECK (status IN ('new', 'paid', 'shipped', 'cancelled'))
);
CREATE INDEX orders_by_customer ON orders (customer_id);
CREATE TABLE order_items (
    order_id INTEGER NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    product_id INTEGER NOT NULL REFERENCES products (id),
    quantity INTEGER NOT NULL CHECK (quantity > 0),
    unit_price REAL NOT NULL,
    PRIMARY KEY (order_id, product_id)
);
"""

_CUSTOMERS = [
    ("Ada Lovelace", "ada@example.com", "GB"),
    ("Alan Turing", "alan@example.com", "GB"),
    ("Grace Hopper", "grace@example.com", "US"),
    ("Marie Curie", "marie@example.com", "FR"),
    ("Emmy Noether", "emmy@example.com", "DE"),
    ("Hedy Lamarr", "hedy@example.com", "AT"),
    ("Katherine Johnson", "katherine@example.com", "US"),
    ("Rosalind Franklin", "rosalind@example.com", "GB"),
]
_PRODUCTS = [
    ("Mechanical keyboard", "hardware", 89.0, 25),
    ("Wireless mouse", "hardware", 24.5, 80),
    ("27-inch monitor", "hardware", 219.0, 12),
    ("USB-C hub", "hardware", 35.0, 40),
    ("Laptop stand", "accessories", 29.9, 33),
    ("Desk lamp", "accessories", 42.0, 18),
    ("Notebook (A5)", "stationery", 4.5, 300),
    ("Fountain pen", "stationery", 19.0, 60),
    ("Noise-cancelling headphones", "audio", 249.0, 9),
    ("Bluetooth speaker", "audio", 59.0, 0),
]
_STATUSES = ["paid", "shipped", "new", "paid", "cancelled", "shipped"]


def demo_script() -> str:
    """The whole database as one SQL script: schema, then rows made by fixed rules (no randomness)."""
    lines = [DEMO_SCHEMA]
    for number, (name, email, country) in enumerate(_CUSTOMERS, start=1):
        created = f"2025-01-{number * 3:02d} 09:00:00"
        lines.append(
            f"INSERT INTO customers (id, name, email, country, created_at) "
            f"VALUES ({number}, '{name}', '{email}', '{country}', '{created}');"
        )
    for number, (name, category, price, stock) in enumerate(_PRODUCTS, start=1):
        lines.append(
            "INSERT INTO products (id, name, category, price, stock) "
            f"VALUES ({number}, '{name}', '{category}', {price}, {stock});"
        )
    for order in range(1, 16):
        customer = (order * 5) % len(_CUSTOMERS) + 1
        day = f"2025-{(order % 6) + 2:02d}-{(order * 7) % 27 + 1:02d} {8 + order % 10:02d}:30:00"
        status = _STATUSES[order % len(_STATUSES)]
        lines.append(
            "INSERT INTO orders (id, customer_id, ordered_at, status) "
            f"VALUES ({order}, {customer}, '{day}', '{status}');"
        )
        for line in range(1 + order % 3):
            product = (order * 3 + line * 4) % len(_PRODUCTS) + 1
            quantity = 1 + (order + line) % 3
            price = _PRODUCTS[product - 1][2]
            lines.append(
                "INSERT INTO order_items (order_id, product_id, quantity, unit_price) "
                f"VALUES ({order}, {product}, {quantity}, {price});"
            )
    return "\n".join(lines) + "\n"


def create_demo_database(path: Path) -> bool:
    """Create the demo database at `path` unless a file is there; True if it was created."""
    if path.exists():
        return False
    create_file(path, demo_script())
    return True
