"""Search QA over a generated corpus: multi-hop questions about invented people and companies, answered by searching
a BM25 index with a tool.

The corpus, drawn from ``corpus_seed`` alone (nothing is downloaded; every instance of one set of options shares
it): ``people`` invented people, each born in one of ``cities`` invented cities in a year, with a job, and
``companies`` invented companies, each founded by a different person in a year, making a product; one document per
person ("Mirel Toskan was born in Quorva in 1931. Mirel Toskan worked as a sailor.") and per company ("Drelix Works
was founded by Mirel Toskan in 1968. Drelix Works makes lamps."). No fact in it is in any model's pretraining.

An instance, drawn from the seed, is one question of the kinds in ``kinds``:

- ``born``: where a person was born (one hop: the person's document);
- ``founder_born``: where the founder of a company was born (two hops: the company's document names the founder,
  whose document names the city);
- ``founder_job``: what the founder of a company worked as (two hops).

Tools: ``search(query, k)`` returns the ``k`` (1 to 10, 3 by default) documents that best match ``query`` by BM25
(``bm25s``; the index is built on first use in a process and kept for the corpus's options), and ``answer(value)``
ends the episode with ``correct_reward`` when the value is the answer, without regard to case or blanks, else 0.

The expert (``expert_plan``, the teacher of ``teacher_mix``) searches the question's entity by name, then, for two
hops, the founder its result names, then answers. Instances are split between training and validation by the
entity the question starts from (``held_out_maps``): validation asks about people and companies that no training
question starts from.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ragen_core.envs.base import bounded, bounded_reward, register_env
from ragen_core.envs.invented import invented_words
from ragen_core.envs.tool_env import ToolEnv, tool
from ragen_core.tools import ToolCall, ToolResult

KINDS = ("born", "founder_born", "founder_job")
JOBS = ("sailor", "painter", "baker", "engineer", "teacher", "pilot", "farmer", "doctor", "weaver", "miner")
PRODUCTS = ("lamps", "boats", "shoes", "clocks", "bicycles", "radios", "paper", "glass", "rope", "soap")
SUFFIXES = ("Works", "Labs", "Foods", "Motors", "Press", "Mills", "Traders", "Studios")
MAX_QUERY = 300  # characters of one search
_INDEXES: dict[tuple[int, int, int, int], Any] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Person:
    name: str
    city: str
    year: int
    job: str


@dataclass(frozen=True)
class Company:
    name: str
    founder: int  # index of the founder in the corpus's people
    year: int
    product: str


@dataclass(frozen=True)
class Corpus:
    """The people, the companies and their documents: people first, then companies, in order."""

    people: tuple[Person, ...]
    companies: tuple[Company, ...]

    @property
    def documents(self) -> list[str]:
        texts = [f"{p.name} was born in {p.city} in {p.year}. {p.name} worked as a {p.job}." for p in self.people]
        texts += [
            f"{c.name} was founded by {self.people[c.founder].name} in {c.year}. {c.name} makes {c.product}."
            for c in self.companies
        ]
        return texts


def generate_corpus(corpus_seed: int, people: int, companies: int, cities: int) -> Corpus:
    """The corpus of these options (module docstring): distinct names throughout, each company founded by a
    different person."""
    rng = np.random.default_rng([corpus_seed, 0x5EA4C4])
    taken: set[str] = set()
    city_names = invented_words(rng, cities, 2, taken)
    first, last = invented_words(rng, people, 1, taken), invented_words(rng, people, 2, taken)
    persons = tuple(
        Person(
            f"{first[i]} {last[i]}",
            city_names[int(rng.integers(cities))],
            int(rng.integers(1900, 1990)),
            JOBS[int(rng.integers(len(JOBS)))],
        )
        for i in range(people)
    )
    names = invented_words(rng, companies, 2, taken)
    founders = rng.choice(people, size=companies, replace=False)
    firms = tuple(
        Company(
            f"{names[i]} {SUFFIXES[int(rng.integers(len(SUFFIXES)))]}",
            int(founders[i]),
            int(rng.integers(1950, 2020)),
            PRODUCTS[int(rng.integers(len(PRODUCTS)))],
        )
        for i in range(companies)
    )
    return Corpus(persons, firms)


class SearchIndex:
    """A BM25 index (``bm25s``) over a corpus's documents; safe to search from several threads."""

    def __init__(self, corpus: Corpus) -> None:
        import bm25s

        self.corpus, self.documents = corpus, corpus.documents
        self._bm25s = bm25s
        self._retriever = bm25s.BM25()
        self._retriever.index(self._tokens(self.documents), show_progress=False)
        self._lock = threading.Lock()

    def _tokens(self, texts: list[str]) -> Any:
        return self._bm25s.tokenize(texts, stopwords="en", show_progress=False, return_ids=False)

    def search(self, query: str, k: int) -> list[int]:
        """The indexes of the at most ``k`` documents that match ``query`` best, best first (none that shares no
        word with it)."""
        words = self._tokens([query])
        if not words[0]:
            return []
        with self._lock:
            found, scores = self._retriever.retrieve(words, k=min(k, len(self.documents)), show_progress=False)
        return [int(d) for d, s in zip(found[0], scores[0], strict=True) if s > 0]


def search_index(corpus_seed: int, people: int, companies: int, cities: int) -> SearchIndex:
    """The index of the corpus of these options, built once per process."""
    key = (corpus_seed, people, companies, cities)
    with _LOCK:
        if key not in _INDEXES:
            _INDEXES[key] = SearchIndex(generate_corpus(*key))
        return _INDEXES[key]


@register_env("search_qa")
class SearchQAEnv(ToolEnv):
    """Multi-hop questions over a generated corpus, answered with a BM25 search tool (module docstring)."""

    name = "search_qa"
    held_out_maps = True

    def __init__(
        self,
        corpus_seed: int = 0,
        people: int = 200,
        companies: int = 150,
        cities: int = 24,
        kinds: str = "founder_born,founder_job",
        correct_reward: float = 1.0,
    ) -> None:
        self.corpus_seed = bounded("corpus_seed", corpus_seed, 0, 2**31 - 1)
        self.people = bounded("people", people, 2, 5_000)
        self.companies = bounded("companies", companies, 1, self.people)
        self.cities = bounded("cities", cities, 2, 500)
        chosen = [k.strip() for k in kinds.split(",")] if isinstance(kinds, str) else []
        if not chosen or any(k not in KINDS for k in chosen):
            raise ValueError(f"kinds must be a comma-separated list of {', '.join(KINDS)}, got {kinds!r}")
        self.kinds = tuple(dict.fromkeys(chosen))
        self.correct_reward = bounded_reward("correct_reward", correct_reward)
        if self.correct_reward <= 0:
            raise ValueError(f"correct_reward must be above 0, got {correct_reward!r}")
        self.question, self.gold, self.hops = "", "", [0]
        self.seen: set[int] = set()
        self.won = False

    @property
    def index(self) -> SearchIndex:
        return search_index(self.corpus_seed, self.people, self.companies, self.cities)

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        """Draw the question of ``seed`` (module docstring); ``hops`` are the documents that answer it, in order."""
        rng = np.random.default_rng(seed)
        corpus = self.index.corpus
        kind = self.kinds[int(rng.integers(len(self.kinds)))]
        if kind == "born":
            index = int(rng.integers(self.people))
            person = corpus.people[index]
            self.question, self.gold, self.hops = f"Where was {person.name} born?", person.city, [index]
        else:
            which = int(rng.integers(self.companies))
            company = corpus.companies[which]
            founder = corpus.people[company.founder]
            if kind == "founder_born":
                self.question, self.gold = f"Where was the founder of {company.name} born?", founder.city
            else:
                self.question, self.gold = f"What did the founder of {company.name} work as?", founder.job
            self.hops = [self.people + which, company.founder]
        self.seen, self.won = set(), False
        return self.render(), {"success": False}

    def render(self) -> str:
        return self.question

    def map_key(self) -> str:
        """The name the question starts from, a person's or a company's (``held_out_maps``)."""
        return self._name_of(self.hops[0])

    def instruction(self) -> str:
        return (
            "Answer the question with the tools: search the documents for what you need, one call per reply, then "
            "call answer."
        )

    def brief(self) -> str:
        return "Search, then answer."

    @property
    def success(self) -> bool:
        return self.won

    def reward_bounds(self, max_actions: int) -> tuple[float, float]:
        return 0.0, self.correct_reward

    def success_from_reward(self, env_reward: float) -> bool | None:
        return env_reward == self.correct_reward

    def end_reason(self) -> str:
        return "success" if self.won else "wrong_answer"

    @tool
    def search(self, query: str, k: int = 3) -> str:
        """Search the documents.

        Args:
            query: words to look for, e.g. a name
            k: how many documents to return, 1 to 10
        """
        if not 1 <= k <= 10:
            raise ValueError(f"k must be from 1 to 10, got {k}")
        if len(query) > MAX_QUERY:
            raise ValueError(f"a query has at most {MAX_QUERY} characters")
        found = self.index.search(query, k)
        self.seen.update(found)
        documents = self.index.documents
        return "\n".join(f"{n}. {documents[d]}" for n, d in enumerate(found, 1)) or "no document matches"

    @tool
    def answer(self, value: str) -> ToolResult:
        """Give the final answer to the question; this ends the episode.

        Args:
            value: the answer, e.g. a city's name
        """
        self.won = " ".join(value.split()).casefold() == self.gold.casefold()
        return ToolResult(f"{value} is {'right' if self.won else 'wrong'}.", self.correct_reward * self.won, done=True)

    def expert_plan(self, actions_left: int) -> list[str]:
        """A search for each document of the question's chain not yet shown, by the name that leads to it, then
        the answer."""
        names = [self._name_of(d) for d in self.hops if d not in self.seen]
        return [
            *(ToolCall("search", {"query": n}).text() for n in names),
            ToolCall("answer", {"value": self.gold}).text(),
        ]

    def _name_of(self, document: int) -> str:
        corpus = self.index.corpus
        if document < self.people:
            return corpus.people[document].name
        return corpus.companies[document - self.people].name

    def teacher_actions(self, actions_left: int) -> list[str] | None:
        """The expert's next call."""
        return self.expert_plan(actions_left)[:1]

    def sample_action(self, rng: np.random.Generator) -> str:
        """A plausible call, well-formed and mostly useless: a search for a random person or company, or an answer
        with a random city or job."""
        corpus = self.index.corpus
        if rng.random() < 0.6:
            pick = int(rng.integers(self.people + self.companies))
            return ToolCall("search", {"query": self._name_of(pick)}).text()
        guesses = [*(p.city for p in corpus.people[:10]), *JOBS]
        return ToolCall("answer", {"value": guesses[int(rng.integers(len(guesses)))]}).text()
