"""A small Spider-format sample written by this project: four SQLite databases, 44 questions.

It lets ``lightning/Spider-v0`` run anywhere (tests, demos, a laptop without the 1 GB Spider
download). The content lives here as Python data; the files (``dev.json``,
``train_spider.json``, ``tables.json``, ``database/<db_id>/<db_id>.sqlite``) are built on first
use into the cache directory, in Spider's own layout, so the same loader reads both. Dev and train
use different databases, as in Spider.

Build it by hand with::

    python -m agentgym_lightning.envs.spider.sample DEST
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

from agentgym_lightning.paths import build_once

__all__ = ["SAMPLE_DATABASES", "SAMPLE_QUESTIONS", "sample_version", "build_sample", "ensure_sample"]

# Each database: its DDL, then rows per table (in insertion order).
SAMPLE_DATABASES: dict[str, dict[str, Any]] = {
    "school_library": {
        "ddl": [
            "CREATE TABLE author (author_id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT, birth_year INTEGER)",
            "CREATE TABLE book (book_id INTEGER PRIMARY KEY, title TEXT NOT NULL, author_id INTEGER, year INTEGER, "
            "pages INTEGER, genre TEXT, FOREIGN KEY (author_id) REFERENCES author(author_id))",
            "CREATE TABLE member (member_id INTEGER PRIMARY KEY, name TEXT NOT NULL, age INTEGER, city TEXT)",
            "CREATE TABLE loan (loan_id INTEGER PRIMARY KEY, book_id INTEGER, member_id INTEGER, loan_date TEXT, "
            "returned INTEGER, FOREIGN KEY (book_id) REFERENCES book(book_id), "
            "FOREIGN KEY (member_id) REFERENCES member(member_id))",
        ],
        "rows": {
            "author": [
                (1, "Ama Mensah", "Ghana", 1961),
                (2, "Lars Berg", "Norway", 1975),
                (3, "Chen Wei", "China", 1982),
                (4, "Maria Souza", "Brazil", 1958),
                (5, "Ines Costa", "Brazil", 1990),
                (6, "Tom Hardy", "UK", 1949),
            ],
            "book": [
                (1, "River of Salt", 1, 1998, 320, "novel"),
                (2, "Cold Harbour", 2, 2005, 280, "crime"),
                (3, "The Ninth Bridge", 2, 2011, 410, "crime"),
                (4, "Paper Lanterns", 3, 2015, 190, "poetry"),
                (5, "Southern Winds", 4, 1987, 505, "novel"),
                (6, "Green Coffee", 4, 1993, 250, "essay"),
                (7, "Quiet Numbers", 5, 2020, 150, "poetry"),
                (8, "Old Roads", 6, 1979, 360, "history"),
                (9, "The Last Ferry", 2, 2019, 300, "crime"),
            ],
            "member": [
                (1, "Kofi", 17, "Accra"),
                (2, "Sara", 34, "Oslo"),
                (3, "Ling", 22, "Shanghai"),
                (4, "Paulo", 45, "Recife"),
                (5, "Nora", 17, "Oslo"),
                (6, "Ahmed", 61, "Cairo"),
            ],
            "loan": [
                (1, 1, 1, "2023-01-05", 1),
                (2, 2, 2, "2023-01-09", 1),
                (3, 3, 2, "2023-02-11", 0),
                (4, 4, 3, "2023-02-14", 1),
                (5, 2, 5, "2023-03-01", 0),
                (6, 5, 4, "2023-03-03", 1),
                (7, 9, 2, "2023-03-20", 0),
                (8, 1, 3, "2023-04-02", 1),
                (9, 2, 1, "2023-04-15", 1),
            ],
        },
    },
    "city_transit": {
        "ddl": [
            "CREATE TABLE line (line_id INTEGER PRIMARY KEY, name TEXT NOT NULL, color TEXT, opened INTEGER)",
            "CREATE TABLE station (station_id INTEGER PRIMARY KEY, name TEXT NOT NULL, district TEXT, zone INTEGER)",
            "CREATE TABLE stop (line_id INTEGER, station_id INTEGER, position INTEGER, "
            "PRIMARY KEY (line_id, station_id), FOREIGN KEY (line_id) REFERENCES line(line_id), "
            "FOREIGN KEY (station_id) REFERENCES station(station_id))",
            "CREATE TABLE ridership (station_id INTEGER, year INTEGER, passengers INTEGER, "
            "PRIMARY KEY (station_id, year), FOREIGN KEY (station_id) REFERENCES station(station_id))",
        ],
        "rows": {
            "line": [
                (1, "North Line", "red", 1965),
                (2, "Harbour Line", "blue", 1978),
                (3, "Airport Express", "green", 2009),
            ],
            "station": [
                (1, "Central", "Old Town", 1),
                (2, "Market Square", "Old Town", 1),
                (3, "University", "Hill", 2),
                (4, "Docks", "Harbour", 2),
                (5, "Airport", "Outskirts", 3),
                (6, "Lighthouse", "Harbour", 3),
                (7, "Stadium", "Hill", 2),
            ],
            "stop": [
                (1, 1, 1), (1, 2, 2), (1, 3, 3),
                (2, 1, 1), (2, 4, 2), (2, 6, 3),
                (3, 1, 1), (3, 5, 2),
            ],
            "ridership": [
                (1, 2022, 51000), (1, 2023, 56000),
                (2, 2022, 12000), (2, 2023, 13500),
                (3, 2022, 20000), (3, 2023, 19000),
                (4, 2022, 8000), (4, 2023, 9100),
                (5, 2022, 30500), (5, 2023, 41000),
                (6, 2023, 2100),
                (7, 2022, 15000), (7, 2023, 15000),
            ],
        },
    },
    "music_festival": {
        "ddl": [
            "CREATE TABLE band (band_id INTEGER PRIMARY KEY, name TEXT NOT NULL, genre TEXT, formed INTEGER, country TEXT)",
            "CREATE TABLE festival (festival_id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT, year INTEGER, "
            "attendance INTEGER)",
            "CREATE TABLE performance (festival_id INTEGER, band_id INTEGER, slot TEXT, fee REAL, "
            "PRIMARY KEY (festival_id, band_id), FOREIGN KEY (festival_id) REFERENCES festival(festival_id), "
            "FOREIGN KEY (band_id) REFERENCES band(band_id))",
        ],
        "rows": {
            "band": [
                (1, "The Lanterns", "rock", 2004, "Ireland"),
                (2, "Blue Static", "electronic", 2012, "Germany"),
                (3, "Desert Choir", "folk", 1998, "Mali"),
                (4, "Night Owls", "jazz", 2015, "USA"),
                (5, "Iron Tide", "rock", 1991, "UK"),
                (6, "Velvet Moss", "folk", 2018, "Ireland"),
                (7, "Paper Kites", "indie", 2021, "Canada"),
            ],
            "festival": [
                (1, "Summer Sound", "Dublin", 2022, 42000),
                (2, "Coastline", "Lisbon", 2022, 28000),
                (3, "Summer Sound", "Dublin", 2023, 47000),
                (4, "Nordic Lights", "Bergen", 2023, 15000),
            ],
            "performance": [
                (1, 1, "headline", 50000.0), (1, 3, "evening", 12000.0), (1, 6, "afternoon", 4000.0),
                (2, 2, "headline", 35000.0), (2, 4, "evening", 9000.0),
                (3, 5, "headline", 65000.0), (3, 1, "evening", 30000.0), (3, 2, "afternoon", 15000.0),
                (4, 3, "headline", 20000.0), (4, 6, "evening", 6000.0),
            ],
        },
    },
    "bakery_orders": {
        "ddl": [
            "CREATE TABLE product (product_id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT, price REAL)",
            "CREATE TABLE customer (customer_id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT)",
            "CREATE TABLE orders (order_id INTEGER PRIMARY KEY, customer_id INTEGER, order_date TEXT, "
            "FOREIGN KEY (customer_id) REFERENCES customer(customer_id))",
            "CREATE TABLE order_item (order_id INTEGER, product_id INTEGER, quantity INTEGER, "
            "PRIMARY KEY (order_id, product_id), FOREIGN KEY (order_id) REFERENCES orders(order_id), "
            "FOREIGN KEY (product_id) REFERENCES product(product_id))",
        ],
        "rows": {
            "product": [
                (1, "Sourdough", "bread", 5.5),
                (2, "Baguette", "bread", 2.75),
                (3, "Croissant", "pastry", 2.0),
                (4, "Cinnamon Roll", "pastry", 3.25),
                (5, "Carrot Cake", "cake", 18.0),
                (6, "Rye Loaf", "bread", 4.5),
                (7, "Lemon Tart", "cake", 3.75),
            ],
            "customer": [
                (1, "Ana", "Porto"),
                (2, "Ben", "Leeds"),
                (3, "Chloe", "Porto"),
                (4, "Dev", "Pune"),
            ],
            "orders": [
                (1, 1, "2024-05-01"),
                (2, 2, "2024-05-01"),
                (3, 1, "2024-05-03"),
                (4, 3, "2024-05-04"),
                (5, 2, "2024-05-06"),
            ],
            "order_item": [
                (1, 1, 2), (1, 3, 4),
                (2, 2, 1),
                (3, 5, 1), (3, 3, 2),
                (4, 4, 6),
                (5, 1, 1), (5, 6, 2), (5, 3, 1),
            ],
        },
    },
}

#: (split, db_id, question, gold SQL). Written in Spider's style: DISTINCT, ORDER BY, GROUP BY,
#: joins, nested queries, set operations, and an empty result.
SAMPLE_QUESTIONS: list[tuple[str, str, str, str]] = [
    # ---- dev: school_library
    ("dev", "school_library", "How many books are there?", "SELECT count(*) FROM book"),
    ("dev", "school_library", "List the titles of all crime books.", "SELECT title FROM book WHERE genre = 'crime'"),
    ("dev", "school_library", "What are the distinct countries of the authors?", "SELECT DISTINCT country FROM author"),
    ("dev", "school_library", "Show the title and year of every book, newest first.",
     "SELECT title, year FROM book ORDER BY year DESC"),
    ("dev", "school_library", "What is the title of the longest book?",
     "SELECT title FROM book ORDER BY pages DESC LIMIT 1"),
    ("dev", "school_library", "How many books has each author written? Show the author name and the count.",
     "SELECT T1.name, count(*) FROM author AS T1 JOIN book AS T2 ON T1.author_id = T2.author_id GROUP BY T1.author_id"),
    ("dev", "school_library", "What are the names of members who borrowed a book written by Lars Berg?",
     "SELECT DISTINCT T1.name FROM member AS T1 JOIN loan AS T2 ON T1.member_id = T2.member_id "
     "JOIN book AS T3 ON T2.book_id = T3.book_id JOIN author AS T4 ON T3.author_id = T4.author_id "
     "WHERE T4.name = 'Lars Berg'"),
    ("dev", "school_library", "Which books have never been borrowed?",
     "SELECT title FROM book WHERE book_id NOT IN (SELECT book_id FROM loan)"),
    ("dev", "school_library", "What is the average age of members who live in Oslo?",
     "SELECT avg(age) FROM member WHERE city = 'Oslo'"),
    ("dev", "school_library", "How many different members have a loan that is not returned yet?",
     "SELECT count(DISTINCT member_id) FROM loan WHERE returned = 0"),
    ("dev", "school_library", "List the names of authors born after 2000.",
     "SELECT name FROM author WHERE birth_year > 2000"),
    # ---- dev: city_transit
    ("dev", "city_transit", "How many stations are in zone 2?", "SELECT count(*) FROM station WHERE zone = 2"),
    ("dev", "city_transit", "List the names of all lines in the order they opened.",
     "SELECT name FROM line ORDER BY opened"),
    ("dev", "city_transit", "What are the names of the stations on the Harbour Line, in stop order?",
     "SELECT T2.name FROM stop AS T1 JOIN station AS T2 ON T1.station_id = T2.station_id "
     "JOIN line AS T3 ON T1.line_id = T3.line_id WHERE T3.name = 'Harbour Line' ORDER BY T1.position"),
    ("dev", "city_transit", "How many stops does each line have? Show the line name and the number of stops.",
     "SELECT T1.name, count(*) FROM line AS T1 JOIN stop AS T2 ON T1.line_id = T2.line_id GROUP BY T1.line_id"),
    ("dev", "city_transit", "Which station had the most passengers in 2023?",
     "SELECT T1.name FROM station AS T1 JOIN ridership AS T2 ON T1.station_id = T2.station_id "
     "WHERE T2.year = 2023 ORDER BY T2.passengers DESC LIMIT 1"),
    ("dev", "city_transit", "What is the total number of passengers over all stations in 2022?",
     "SELECT sum(passengers) FROM ridership WHERE year = 2022"),
    ("dev", "city_transit", "Which districts have more than one station?",
     "SELECT district FROM station GROUP BY district HAVING count(*) > 1"),
    ("dev", "city_transit", "Find the names of stations served by more than one line.",
     "SELECT T1.name FROM station AS T1 JOIN stop AS T2 ON T1.station_id = T2.station_id "
     "GROUP BY T1.station_id HAVING count(*) > 1"),
    ("dev", "city_transit", "What are the names of the stations that no line stops at?",
     "SELECT name FROM station WHERE station_id NOT IN (SELECT station_id FROM stop)"),
    ("dev", "city_transit", "What are the distinct zones of stations in the Hill or Harbour districts?",
     "SELECT DISTINCT zone FROM station WHERE district = 'Hill' OR district = 'Harbour'"),
    ("dev", "city_transit", "What is the color of the line that opened most recently?",
     "SELECT color FROM line WHERE opened = (SELECT max(opened) FROM line)"),
    # ---- train: music_festival
    ("train", "music_festival", "How many bands are there?", "SELECT count(*) FROM band"),
    ("train", "music_festival", "List the names of rock bands.", "SELECT name FROM band WHERE genre = 'rock'"),
    ("train", "music_festival", "What are the distinct genres of bands from Ireland?",
     "SELECT DISTINCT genre FROM band WHERE country = 'Ireland'"),
    ("train", "music_festival", "Show the names and years of festivals, most attended first.",
     "SELECT name, year FROM festival ORDER BY attendance DESC"),
    ("train", "music_festival", "Which band was paid the highest fee for a single performance?",
     "SELECT T1.name FROM band AS T1 JOIN performance AS T2 ON T1.band_id = T2.band_id ORDER BY T2.fee DESC LIMIT 1"),
    ("train", "music_festival", "What is the total fee paid to each band? Show the band name and the total.",
     "SELECT T1.name, sum(T2.fee) FROM band AS T1 JOIN performance AS T2 ON T1.band_id = T2.band_id "
     "GROUP BY T1.band_id"),
    ("train", "music_festival", "Which bands played the 2023 edition of Summer Sound?",
     "SELECT T1.name FROM band AS T1 JOIN performance AS T2 ON T1.band_id = T2.band_id "
     "JOIN festival AS T3 ON T2.festival_id = T3.festival_id WHERE T3.name = 'Summer Sound' AND T3.year = 2023"),
    ("train", "music_festival", "Which bands have never performed at any festival?",
     "SELECT name FROM band WHERE band_id NOT IN (SELECT band_id FROM performance)"),
    ("train", "music_festival", "What is the average attendance of festivals held in 2022?",
     "SELECT avg(attendance) FROM festival WHERE year = 2022"),
    ("train", "music_festival", "Which cities hosted festivals in both 2022 and 2023?",
     "SELECT city FROM festival WHERE year = 2022 INTERSECT SELECT city FROM festival WHERE year = 2023"),
    ("train", "music_festival", "How many bands headlined at least one festival?",
     "SELECT count(DISTINCT band_id) FROM performance WHERE slot = 'headline'"),
    # ---- train: bakery_orders
    ("train", "bakery_orders", "How many products cost more than 4?", "SELECT count(*) FROM product WHERE price > 4"),
    ("train", "bakery_orders", "List all product names from the cheapest to the most expensive.",
     "SELECT name FROM product ORDER BY price"),
    ("train", "bakery_orders", "What are the distinct categories of products?", "SELECT DISTINCT category FROM product"),
    ("train", "bakery_orders", "What is the average price of bread products?",
     "SELECT avg(price) FROM product WHERE category = 'bread'"),
    ("train", "bakery_orders", "How many orders has each customer placed? Show the customer name and count.",
     "SELECT T1.name, count(*) FROM customer AS T1 JOIN orders AS T2 ON T1.customer_id = T2.customer_id "
     "GROUP BY T1.customer_id"),
    ("train", "bakery_orders", "Which customers have never placed an order?",
     "SELECT name FROM customer WHERE customer_id NOT IN (SELECT customer_id FROM orders)"),
    ("train", "bakery_orders", "What is the name of the product ordered in the largest total quantity?",
     "SELECT T1.name FROM product AS T1 JOIN order_item AS T2 ON T1.product_id = T2.product_id "
     "GROUP BY T1.product_id ORDER BY sum(T2.quantity) DESC LIMIT 1"),
    ("train", "bakery_orders", "List the dates of orders placed by customers from Porto.",
     "SELECT T2.order_date FROM customer AS T1 JOIN orders AS T2 ON T1.customer_id = T2.customer_id "
     "WHERE T1.city = 'Porto'"),
    ("train", "bakery_orders", "What is the total amount spent in order 5?",
     "SELECT sum(T1.quantity * T2.price) FROM order_item AS T1 JOIN product AS T2 ON T1.product_id = T2.product_id "
     "WHERE T1.order_id = 5"),
    ("train", "bakery_orders", "Which products were never ordered?",
     "SELECT name FROM product WHERE product_id NOT IN (SELECT product_id FROM order_item)"),
    ("train", "bakery_orders", "Which cities have more than one customer?",
     "SELECT city FROM customer GROUP BY city HAVING count(*) > 1"),
]

_SPLIT_FILES = {"dev": "dev.json", "train": "train_spider.json"}


def sample_version() -> str:
    """A short hash of the sample's content: the cache folder changes when the content does."""
    blob = json.dumps([SAMPLE_DATABASES, SAMPLE_QUESTIONS], sort_keys=True, default=list).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def _tables_json_entry(db_id: str, conn: sqlite3.Connection) -> dict[str, Any]:
    """Spider's ``tables.json`` entry for a database, derived from the database itself."""
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY rowid")]
    column_names: list[list[Any]] = [[-1, "*"]]
    column_types = ["text"]
    primary_keys: list[int] = []
    foreign_keys: list[list[int]] = []
    index: dict[tuple[str, str], int] = {}
    for t, table in enumerate(tables):
        for _cid, name, ctype, _notnull, _default, pk in conn.execute(f'PRAGMA table_info("{table}")'):
            index[(table.lower(), name.lower())] = len(column_names)
            if pk:
                primary_keys.append(len(column_names))
            column_names.append([t, name])
            column_types.append("number" if any(k in ctype.upper() for k in ("INT", "REAL", "NUM")) else "text")
    for table in tables:
        for fk in conn.execute(f'PRAGMA foreign_key_list("{table}")'):
            ref_table, src, dst = fk[2], fk[3], fk[4]
            foreign_keys.append([index[(table.lower(), src.lower())], index[(ref_table.lower(), dst.lower())]])
    return {
        "db_id": db_id,
        "table_names_original": tables,
        "table_names": [t.replace("_", " ") for t in tables],
        "column_names_original": column_names,
        "column_names": [[t, n.replace("_", " ").lower()] for t, n in column_names],
        "column_types": column_types,
        "primary_keys": primary_keys,
        "foreign_keys": foreign_keys,
    }


def build_sample(dest: str | os.PathLike[str]) -> Path:
    """Write the sample in Spider's layout under ``dest`` (created; must not hold other files)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    tables_json = []
    for db_id, spec in SAMPLE_DATABASES.items():
        db_dir = dest / "database" / db_id
        db_dir.mkdir(parents=True, exist_ok=True)
        db_file = db_dir / f"{db_id}.sqlite"
        if db_file.exists():
            db_file.unlink()
        conn = sqlite3.connect(db_file)
        try:
            for ddl in spec["ddl"]:
                conn.execute(ddl)
            for table, rows in spec["rows"].items():
                if rows:
                    marks = ", ".join("?" * len(rows[0]))
                    conn.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
            conn.commit()
            (db_dir / "schema.sql").write_text(";\n".join(spec["ddl"]) + ";\n", encoding="utf-8")
            tables_json.append(_tables_json_entry(db_id, conn))
        finally:
            conn.close()
    for split, filename in _SPLIT_FILES.items():
        items = [
            {"db_id": db_id, "question": question, "query": query}
            for s, db_id, question, query in SAMPLE_QUESTIONS
            if s == split
        ]
        (dest / filename).write_text(json.dumps(items, indent=1) + "\n", encoding="utf-8")
    (dest / "tables.json").write_text(json.dumps(tables_json, indent=1) + "\n", encoding="utf-8")
    (dest / "SAMPLE.md").write_text(
        "Built by agentgym_lightning.envs.spider.sample: a small sample in Spider's layout, not Spider.\n"
        "Point the env at real Spider with `agentgym-lightning data spider PATH`.\n",
        encoding="utf-8",
    )
    return dest


def ensure_sample(cache_root: str | os.PathLike[str]) -> Path:
    """The sample's folder under ``cache_root``, built (atomically) if it is not there yet."""
    def complete(p: Path) -> bool:
        return (p / "dev.json").is_file() and (p / "tables.json").is_file()

    return build_once(Path(cache_root) / f"spider-sample-{sample_version()}", build_sample, complete)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the bundled Spider-format sample into DEST.")
    parser.add_argument("dest", help="folder to write dev.json, train_spider.json, tables.json and database/ into")
    args = parser.parse_args(argv)
    out = build_sample(args.dest)
    print(f"wrote {len(SAMPLE_QUESTIONS)} questions over {len(SAMPLE_DATABASES)} databases to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
