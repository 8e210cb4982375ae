"""Chat instructions for training and measuring EAGLE heads on chat targets (SmolLM2 and the like):
short user requests of the kinds an instruction model answers (explain, list, write, rewrite, code,
compare, advise), written from templates over topics with a fixed seed.

    python tools/build_instructions.py        # -> batchspec/assets/instructions/{train,bench}.jsonl

Each line: id, prompt (a user message: give it to `train_draft --chat` or `bench --chat`), kind.
train.jsonl holds 2,000 prompts, bench.jsonl 48 whose topics no training prompt uses, so a head measured
on them meets requests it never saw. The shipped file is this script's output;
rerunning it gives the same bytes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "batchspec" / "assets" / "instructions"

TOPICS = [
    "photosynthesis", "black holes", "the water cycle", "volcanoes", "the immune system", "compound interest",
    "machine learning", "the French Revolution", "plate tectonics", "electric cars", "the printing press",
    "climate change", "vaccines", "the stock market", "recycling", "the Roman Empire", "solar panels",
    "honey bees", "the internet", "earthquakes", "sleep", "coffee", "the moon", "rainbows", "gravity",
    "the human heart", "inflation", "coral reefs", "the Great Wall of China", "DNA", "nuclear energy",
    "tides", "bread baking", "chess", "jazz music", "the Olympic Games", "wind turbines", "bird migration",
    "the periodic table", "antibiotics", "cloud computing", "the Renaissance", "deserts", "glaciers",
    "public libraries", "bicycles", "the metric system", "tea", "penguins", "the Amazon rainforest",
    "supply and demand", "the speed of light", "composting", "blockchains", "the Silk Road", "thunderstorms",
    "mushrooms", "the Pythagorean theorem", "electricity", "democracy", "the violin", "recessions",
    "microplastics", "the Eiffel Tower", "octopuses", "password security", "the Moon landing", "whales",
    "hydropower", "fermentation", "the Fibonacci sequence", "ancient Egypt", "hurricanes", "batteries",
    "sourdough", "elephants", "the Industrial Revolution", "rainwater harvesting", "meditation", "the Milky Way",
    "3D printing", "wildfires", "marathons", "the Nile", "urban gardening", "the human brain", "lighthouses",
]
# Held out for the bench: no training prompt mentions these.
BENCH_TOPICS = [
    "submarines", "the Sahara", "origami", "typewriters", "comets", "the Byzantine Empire", "wolves",
    "geothermal energy", "the saxophone", "tsunamis", "cacti", "the Hubble telescope", "bamboo", "hot air balloons",
    "the Andes", "vitamin D",
]
PEOPLE = ["a ten-year-old", "a busy manager", "a first-year student", "my grandmother", "a tourist", "a new employee"]
TEMPLATES = {
    "explain": ["Explain {t} in simple terms.", "How does {t} work?", "Explain {t} to {p}.",
                "What is the most important thing to know about {t}?", "Why does {t} matter?"],
    "list": ["List three interesting facts about {t}.", "Give me five key terms related to {t}, with one line each.",
             "What are the main advantages and disadvantages of {t}?", "Name three common misconceptions about {t}."],
    "write": ["Write a short poem about {t}.", "Write a haiku about {t}.",
              "Write a two-sentence story that involves {t}.", "Write a short paragraph about {t} for a school magazine.",
              "Write a tweet announcing a talk about {t}."],
    "email": ["Write a short email inviting my team to a lunch talk about {t}.",
              "Write a polite email asking a professor for reading suggestions on {t}."],
    "question": ["What is {t}?", "Can you summarize the history of {t} in a few sentences?",
                 "What would happen if {t} suddenly disappeared?", "How is {t} different today than 100 years ago?"],
    "advice": ["I want to learn about {t}. Where should I start?", "Give me three tips for teaching {t} to {p}.",
               "How can I explain {t} to {p} without jargon?"],
    "quiz": ["Write three quiz questions about {t}, with answers.", "Make a true-or-false question about {t}."],
}
CODE = [
    "Write a Python function that returns the {n}th Fibonacci number.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that counts the vowels in a string.",
    "Write a Python function that reverses the words in a sentence.",
    "Write a Python function that returns the largest of {n} numbers in a list.",
    "Write a Python function that converts Celsius to Fahrenheit.",
    "Write a Python function that removes duplicates from a list while keeping the order.",
    "Write a Python function that computes the factorial of {n}.",
    "Write a Python function that checks whether a number is prime.",
    "Write a Python function that sums the even numbers in a list.",
    "Write a JavaScript function that capitalizes the first letter of every word.",
    "Write a SQL query that returns the {n} most recent orders from a table named orders.",
    "Explain what this Python code does: print(sorted(set(x % {n} for x in range(20))))",
    "Write a Python class for a bank account with deposit and withdraw methods.",
    "How do I read a CSV file in Python? Show a short example.",
    "Write a Python function that merges two sorted lists.",
]
REWRITE = [
    "Rewrite this sentence to sound more formal: {s}", "Make this sentence shorter: {s}",
    "Fix the grammar in this sentence: {s}", "Translate this sentence into French: {s}",
    "Turn this sentence into a question: {s}",
]
SENTENCES = [
    "hey can u send me the report by tomorrow thanks", "The meeting was moved to friday because alot of people was away.",
    "I think that maybe we should probably consider starting the project a little bit earlier than planned.",
    "The cat sat on the warm windowsill all afternoon.", "We are excited to announce our new product line.",
    "Please remember to turn off the lights when you leave the office.", "She dont like coffee but she love tea.",
    "The train to the city leaves every twenty minutes.", "Our team finished the project two weeks ahead of schedule.",
    "It is raining, so the picnic will take place indoors.",
]
MATH = [
    "What is {a} plus {b}?", "What is {a} times {b}?", "If a shirt costs ${a} and is {b}% off, what is the price?",
    "A train travels {a} km in {b} hours. What is its average speed?", "Is {a} divisible by {b}? Explain.",
]


def draw(rng: random.Random, kind: str, topics: list[str]) -> str:
    if kind in TEMPLATES:
        return rng.choice(TEMPLATES[kind]).format(t=rng.choice(topics), p=rng.choice(PEOPLE))
    if kind == "code":
        return rng.choice(CODE).format(n=rng.randint(3, 12))
    if kind == "rewrite":
        return rng.choice(REWRITE).format(s=rng.choice(SENTENCES))
    return rng.choice(MATH).format(a=rng.randint(12, 480), b=rng.randint(2, 60))


def prompts(rng: random.Random, topics: list[str], topical: int, others: int, seen: set) -> list[tuple[str, str]]:
    """`topical` prompts over `topics` (the template kinds in turn, skipping a kind whose prompts ran out),
    then `others` code, rewrite and math ones; none repeats a prompt in `seen` (which grows)."""
    out = []
    for count, kinds in ((topical, list(TEMPLATES)), (others, ["code", "rewrite", "math"])):
        turn = 0
        while len(out) < count + (topical if kinds[0] == "code" else 0):
            for attempt in range(len(kinds) * 200):  # 200 draws per kind before the next kind's turn
                kind = kinds[(turn + attempt // 200) % len(kinds)]
                text = draw(rng, kind, topics)
                if text not in seen:
                    break
            else:
                raise RuntimeError(f"the templates ran out of new prompts after {len(out)}: ask for fewer")
            seen.add(text)
            out.append((kind, text))
            turn += 1
    return out


def rows() -> dict[str, list[dict]]:
    rng, seen = random.Random(0), set()
    splits = {"train": prompts(rng, TOPICS, 1800, 200, seen), "bench": prompts(rng, BENCH_TOPICS, 40, 8, seen)}
    return {split: [{"id": f"{split}-{i:03d}", "prompt": prompt, "kind": kind} for i, (kind, prompt) in enumerate(items)]
            for split, items in splits.items()}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for split, data in rows().items():
        (OUT / f"{split}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in data))
        print(f"wrote {OUT / split}.jsonl: {len(data)} prompts")


if __name__ == "__main__":
    main()
