"""The 64 extraction prompts of the structured-output benchmark and tests: four JSON schemas (a person, a
product, an event, a review), 16 short texts each, written from templates with a fixed seed.

    python tools/build_extraction.py          # -> batchspec/assets/extraction/prompts.jsonl

Each line: id, prompt (the instruction and the text: a user message, for --chat), schema (JSON text),
kind. The shipped file is this script's output; rerunning it gives the same bytes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "batchspec" / "assets" / "extraction" / "prompts.jsonl"

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 30}},
        "required": ["name", "age", "city"], "additionalProperties": False},
    "product": {"type": "object", "properties": {
        "product": {"type": "string", "maxLength": 40}, "price": {"type": "number", "minimum": 0},
        "currency": {"enum": ["USD", "EUR", "GBP", "JPY"]}, "in_stock": {"type": "boolean"}},
        "required": ["product", "price", "currency", "in_stock"], "additionalProperties": False},
    "event": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 50},
        "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "attendees": {"type": "integer", "minimum": 0}},
        "required": ["title", "date", "attendees"], "additionalProperties": False},
    "review": {"type": "object", "properties": {
        "sentiment": {"enum": ["positive", "negative", "neutral"]},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "topics": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}},
        "required": ["sentiment", "rating", "topics"], "additionalProperties": False},
}
INSTRUCTIONS = {
    "person": "Extract the person's name, age and city from the text as JSON.",
    "product": "Extract the product, its price, the currency and whether it is in stock from the text as JSON.",
    "event": "Extract the event's title, its date (YYYY-MM-DD) and the number of attendees from the text as JSON.",
    "review": "Classify the review's sentiment, give the rating from 1 to 5 and list up to three topics, as JSON.",
}
NAMES = ["Marta Kowalski", "Tom Becker", "Aiko Tanaka", "Rui Alves", "Fatima Zahra", "Liam O'Brien", "Chen Wei",
         "Sofia Rossi", "Omar Haddad", "Ingrid Nilsson", "Diego Romero", "Priya Nair", "Jonas Weber", "Ana Costa",
         "Kwame Mensah", "Elena Petrova"]
CITIES = ["Lisbon", "Hamburg", "Osaka", "Porto", "Rabat", "Dublin", "Chengdu", "Turin", "Beirut", "Uppsala",
          "Valencia", "Kochi", "Leipzig", "Recife", "Accra", "Kazan"]
PRODUCTS = ["wireless headphones", "a cast-iron skillet", "the Trail 40 backpack", "a standing desk",
            "noise-cancelling earbuds", "a 2 TB external drive", "the Aero running shoes", "a ceramic teapot"]
CURRENCIES = [("USD", "$"), ("EUR", "€"), ("GBP", "£"), ("JPY", "¥")]
EVENTS = ["Spring Data Meetup", "Harbour Jazz Night", "Open Source Summit", "Community Garden Day",
          "Robotics Fair", "Poetry Slam Finals", "Startup Pitch Evening", "Winter Book Swap"]
TOPICS = ["battery", "price", "delivery", "sound", "comfort", "design", "support", "durability"]


def person(rng: random.Random, i: int) -> str:
    name, city, age = NAMES[i], rng.choice(CITIES), rng.randint(19, 78)
    return rng.choice([f"{name}, {age}, moved to {city} last spring.",
                       f"Our new hire is {name} ({age}) from {city}.",
                       f"{name} lives in {city} and turned {age} this year.",
                       f"At {age}, {name} still runs a small bakery in {city}."])


def product(rng: random.Random, i: int) -> str:
    item, (code, sign) = rng.choice(PRODUCTS), rng.choice(CURRENCIES)
    price = rng.randint(5, 400) if code != "JPY" else rng.randint(800, 40000)
    stock = rng.random() < 0.5
    availability = "Available now" if stock else "Currently sold out"
    return rng.choice([f"{item.capitalize()} for {sign}{price}. {availability}.",
                       f"Deal of the day: {item}, only {price} {code}. {availability}.",
                       f"{availability}: {item} at {sign}{price}."])


def event(rng: random.Random, i: int) -> str:
    title, day, month, people = rng.choice(EVENTS), rng.randint(1, 28), rng.randint(1, 12), rng.randint(12, 900)
    return rng.choice([f"The {title} takes place on 2025-{month:02d}-{day:02d}; {people} people signed up.",
                       f"Join us for the {title} on {day}/{month}/2025. Expected attendance: {people}.",
                       f"{people} guests came to the {title}, held on 2025-{month:02d}-{day:02d}."])


def review(rng: random.Random, i: int) -> str:
    good, a, b = rng.random() < 0.5, *rng.sample(TOPICS, 2)
    return (f"Loved it. The {a} is excellent and the {b} surprised me. Five stars." if good else
            f"Disappointed. The {a} failed after a week and the {b} was poor. One star.")


def rows() -> list[dict]:
    rng = random.Random(0)
    out = []
    for kind, write in (("person", person), ("product", product), ("event", event), ("review", review)):
        for i in range(16):
            out.append({"id": f"{kind}-{i:02d}", "prompt": f"{INSTRUCTIONS[kind]}\n\n{write(rng, i)}",
                        "schema": json.dumps(SCHEMAS[kind]), "kind": kind})
    return out


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows()))
    print(f"wrote {OUT}: {len(rows())} prompts")


if __name__ == "__main__":
    main()
