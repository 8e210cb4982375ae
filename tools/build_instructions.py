"""Chat instructions for training and measuring EAGLE heads on chat targets (SmolLM2 and the like):
short user requests of the kinds an instruction model answers (explain, list, write, rewrite, code,
compare, advise), written from templates over topics with a fixed seed.

    python tools/build_instructions.py        # -> batchspec/assets/instructions/{train,bench}.jsonl

Each line: id, prompt (a user message: give it to `train_draft --chat` or `bench --chat`), kind.
train.jsonl holds 6,000 prompts (the first 2,000 from the first topics and templates, the
rest from more of both), bench.jsonl 48 whose topics no training prompt uses, so a head measured
on them meets requests it never saw. The shipped file is this script's output;
rerunning it gives the same bytes.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
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
# More topics, templates, code tasks and sentences for the prompts drawn after the first 2,000 and the
# bench (appended, so the first 2,000 and bench.jsonl keep their bytes). None is a bench topic.
EXTRA_TOPICS = [
    "tornadoes", "the ozone layer", "fossils", "dinosaurs", "the solar system", "Mars", "Jupiter", "eclipses",
    "the Big Bang", "neutron stars", "satellites", "the International Space Station", "magnets", "sound waves",
    "lasers", "semiconductors", "quantum computing", "artificial intelligence", "robots", "self-driving cars",
    "smartphones", "email", "search engines", "open-source software", "databases", "spreadsheets", "encryption",
    "computer viruses", "video games", "virtual reality", "drones", "the telephone", "radio", "television",
    "photography", "cinema", "the piano", "the guitar", "opera", "hip hop", "classical music", "ballet",
    "theater", "poetry", "novels", "comic books", "museums", "architecture", "bridges", "skyscrapers",
    "castles", "the pyramids", "the Vikings", "the Aztecs", "the Cold War", "World War I", "the Middle Ages",
    "the ancient Greeks", "the Ming dynasty", "the American Revolution", "the Age of Exploration", "samurai",
    "the Black Death", "the Apollo program", "the steam engine", "the light bulb", "paper money", "banks",
    "taxes", "budgeting", "saving for retirement", "credit cards", "mortgages", "small businesses", "marketing",
    "job interviews", "remote work", "time management", "public speaking", "negotiation", "leadership",
    "teamwork", "habits", "exercise", "yoga", "running", "swimming", "nutrition", "vegetables", "vitamins",
    "hydration", "the common cold", "allergies", "blood pressure", "the skeleton", "muscles", "the lungs",
    "the eyes", "hearing", "memory", "emotions", "stress", "friendship", "parenting", "pets", "dogs", "cats",
    "horses", "sharks", "dolphins", "butterflies", "ants", "spiders", "frogs", "owls", "eagles", "snakes",
    "tigers", "pandas", "kangaroos", "rainforests", "mountains", "rivers", "oceans", "lakes", "caves",
    "islands", "soil", "trees", "flowers", "seeds", "gardening", "farming", "rice", "chocolate", "cheese",
    "olive oil", "spices", "pizza", "cooking pasta", "soup", "recycling plastic", "electric bikes", "trains",
    "airplanes", "ships", "maps", "compasses", "calendars", "clocks", "languages", "writing systems",
    "sign language", "libraries at home", "board games", "football", "basketball", "tennis", "cycling races",
    "mountain climbing", "camping", "birdwatching", "astronomy as a hobby", "knitting", "woodworking",
]
EXTRA_TEMPLATES = {
    "explain": ["Give me a one-paragraph explanation of {t}.", "What should {p} know about {t}?",
                "Explain how {t} affects everyday life.", "Describe {t} using an analogy."],
    "list": ["List four questions people often ask about {t}.", "Give me a step-by-step overview of {t}.",
             "What are three surprising facts about {t}?", "List the main parts or ideas of {t}."],
    "write": ["Write a limerick about {t}.", "Write a short dialogue between two friends about {t}.",
              "Write an opening line for a story about {t}.", "Write a product description inspired by {t}."],
    "email": ["Write a short email to {p} recommending a book about {t}.",
              "Write a brief thank-you note to a speaker who gave a talk about {t}."],
    "question": ["Why do people find {t} interesting?", "What are the biggest open questions about {t}?",
                 "How would you describe {t} in one sentence?", "What is a common mistake people make about {t}?"],
    "advice": ["Plan a one-week study schedule for learning about {t}.", "Suggest a fun weekend project about {t}.",
               "How can {p} get started with {t}?"],
    "quiz": ["Write a multiple-choice question about {t}, with the answer.", "Ask me two questions to test what I know about {t}."],
}
EXTRA_CODE = [
    "Write a Python function that returns the {n} most common words in a text.",
    "Write a Python function that flattens a nested list.",
    "Write a Python function that checks whether two strings are anagrams.",
    "Write a Python function that splits a list into chunks of {n} items.",
    "Write a Python function that converts a number to Roman numerals.",
    "Write a Python function that validates an email address with a regular expression.",
    "Write a JavaScript function that debounces another function by {n}00 milliseconds.",
    "Write a SQL query that counts the orders per customer in a table named orders.",
    "Write a bash command that counts the lines in every .txt file in a folder.",
    "Explain the difference between a list and a tuple in Python.",
    "Write a Python function that computes the average of a list, returning 0 for an empty list.",
    "Write a Python generator that yields the first {n} square numbers.",
]
EXTRA_SENTENCES = [
    "me and him went to the store yesterday and buyed some apples", "The results was better then we expected.",
    "Due to the fact that the weather is bad, the game has been cancelled.", "Our office will be closed on Monday.",
    "The new library opens at nine in the morning.", "i cant find the file you sent me last week",
    "The project is very important and it is very urgent and very big.", "He walked his dog along the beach.",
    "Their going to announce the winners later today.", "The software update fixes several small bugs.",
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


@dataclass(frozen=True)
class Bank:
    """What prompts are drawn from: templates per kind, code tasks, sentences to rewrite."""

    templates: dict[str, list[str]]
    code: list[str]
    sentences: list[str]


FIRST = Bank(TEMPLATES, CODE, SENTENCES)
EXTRA = Bank({kind: texts + EXTRA_TEMPLATES[kind] for kind, texts in TEMPLATES.items()}, CODE + EXTRA_CODE,
             SENTENCES + EXTRA_SENTENCES)


def draw(rng: random.Random, kind: str, topics: list[str], bank: Bank) -> str:
    if kind in bank.templates:
        return rng.choice(bank.templates[kind]).format(t=rng.choice(topics), p=rng.choice(PEOPLE))
    if kind == "code":
        return rng.choice(bank.code).format(n=rng.randint(3, 12))
    if kind == "rewrite":
        return rng.choice(REWRITE).format(s=rng.choice(bank.sentences))
    return rng.choice(MATH).format(a=rng.randint(12, 480), b=rng.randint(2, 60))


def prompts(rng: random.Random, topics: list[str], topical: int, others: int, seen: set,
            bank: Bank = FIRST) -> list[tuple[str, str]]:
    """`topical` prompts over `topics` (the template kinds in turn, skipping a kind whose prompts ran out),
    then `others` code, rewrite and math ones; none repeats a prompt in `seen` (which grows)."""
    out = []
    for count, kinds in ((topical, list(TEMPLATES)), (others, ["code", "rewrite", "math"])):
        turn = 0
        while len(out) < count + (topical if kinds[0] == "code" else 0):
            for attempt in range(len(kinds) * 200):  # 200 draws per kind before the next kind's turn
                kind = kinds[(turn + attempt // 200) % len(kinds)]
                text = draw(rng, kind, topics, bank)
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
    # Drawn after the bench so that the first 2,000 and the bench keep their bytes.
    splits["train"] += prompts(rng, TOPICS + EXTRA_TOPICS, 3600, 400, seen, EXTRA)
    return {split: [{"id": f"{split}-{i:03d}", "prompt": prompt, "kind": kind} for i, (kind, prompt) in enumerate(items)]
            for split, items in splits.items()}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for split, data in rows().items():
        (OUT / f"{split}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in data))
        print(f"wrote {OUT / split}.jsonl: {len(data)} prompts")


if __name__ == "__main__":
    main()
