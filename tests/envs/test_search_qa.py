"""The search QA env: its generated corpus, its BM25 search (ranked as a BM25 computed here by hand ranks), its
questions (answers read back from the documents' words), its expert and its held-out split."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from ragen_core.envs import make_env
from ragen_core.envs.held_out import is_validation_map, split_seeds
from ragen_core.envs.search_qa import Company, Corpus, Person, SearchIndex, generate_corpus, search_index
from ragen_core.tools import ToolCall

HAND = Corpus(
    people=(
        Person("Ann Orr", "Vel", 1950, "baker"),
        Person("Bo Kim", "Orr", 1960, "pilot"),
        Person("Cy Dee", "Tam", 1970, "sailor"),
    ),
    companies=(Company("Orr Works", 1, 1990, "lamps"), Company("Tam Labs", 2, 1995, "rope")),
)


def _bm25_ranking(documents: list[str], query: str, k1: float = 1.5, b: float = 0.75) -> list[int]:
    """Documents sharing a word with ``query``, best first, by Lucene's BM25 (lower-cased words of two or more
    letters; the hand corpus and query hold no English stop word but "in", "was", "by", "as", "a")."""
    stop = {"in", "was", "by", "as", "a"}

    def words(text):
        return [w for w in re.findall(r"\w\w+", text.lower()) if w not in stop]

    docs = [words(d) for d in documents]
    average = sum(map(len, docs)) / len(docs)
    scores = []
    for doc in docs:
        score = 0.0
        for term in set(words(query)):
            df = sum(term in d for d in docs)
            tf = doc.count(term)
            if tf:
                idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
                score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(doc) / average))
        scores.append(score)
    return sorted((i for i, s in enumerate(scores) if s > 0), key=lambda i: -scores[i])


@pytest.mark.parametrize("query", ["Orr", "Bo Kim", "Tam rope", "pilot Orr", "Cy Dee sailor Tam", "baker Vel 1950"])
def test_the_search_ranks_as_bm25_computed_by_hand(query):
    index = SearchIndex(HAND)
    assert HAND.documents[3] == "Orr Works was founded by Bo Kim in 1990. Orr Works makes lamps."
    assert index.search(query, 10) == _bm25_ranking(HAND.documents, query)


def test_a_search_without_a_known_word_finds_nothing_and_k_is_bounded():
    env = make_env("search_qa")
    env.reset(0)
    _, _, _, _, info = env.step(ToolCall("search", {"query": "the of and"}).text())
    assert info["tool_call"]["result"] == "no document matches"
    for k in (0, 11):
        _, _, _, _, info = env.step(ToolCall("search", {"query": "works", "k": k}).text())
        assert info["tool_call"]["error"] == "raised" and "k must be from 1 to 10" in info["tool_call"]["result"]
    _, _, _, _, info = env.step(ToolCall("search", {"query": "works", "k": 2}).text())
    assert [line[:3] for line in info["tool_call"]["result"].splitlines()] == ["1. ", "2. "]


def test_the_corpus_is_a_function_of_its_seed_with_distinct_names_and_founders():
    first, again, other = generate_corpus(0, 60, 40, 8), generate_corpus(0, 60, 40, 8), generate_corpus(1, 60, 40, 8)
    assert first == again and first != other
    names = [p.name for p in first.people] + [c.name for c in first.companies]
    assert len(set(names)) == 100 and len({c.founder for c in first.companies}) == 40
    assert search_index(0, 60, 40, 8) is search_index(0, 60, 40, 8)  # built once per process


def _answer_from_documents(documents: list[str], question: str) -> str:
    """The answer read from the documents' words alone, hop by hop."""
    company = re.fullmatch(r"(?:Where was|What did) the founder of (.+?) (?:born|work as)\?", question)
    person = re.fullmatch(r"Where was (.+) born\?", question).group(1) if company is None else None
    if company is not None:
        said = next(d for d in documents if d.startswith(f"{company.group(1)} was founded by "))
        person = re.match(r".+? was founded by (.+) in \d+\.", said).group(1)
    own = next(d for d in documents if d.startswith(f"{person} was born in "))
    city, job = re.fullmatch(rf"{person} was born in (\w+) in \d+\. {person} worked as a (\w+)\.", own).groups()
    return job if question.startswith("What did") else city


@pytest.mark.parametrize(("kind", "calls"), [("born", 2), ("founder_born", 3), ("founder_job", 3)])
def test_the_expert_searches_hop_by_hop_and_answers_right(kind, calls):
    env = make_env("search_qa", kinds=kind)
    for seed in range(30):
        question, _ = env.reset(seed)
        assert env.gold == _answer_from_documents(env.index.documents, question), question
        made = []
        for _ in range(4):
            action = env.teacher_actions(4)[0]
            made.append(ToolCall.from_text(action).name)
            _, reward, done, _, _ = env.step(action)
            if done:
                break
        assert made == ["search"] * (calls - 1) + ["answer"] and reward == 1.0 and env.success


def test_a_wrong_answer_ends_the_episode_unrewarded_and_case_does_not_matter():
    env = make_env("search_qa")
    env.reset(5)
    _, reward, done, _, _ = env.step(ToolCall("answer", {"value": f"  {env.gold.upper()} "}).text())
    assert (reward, done, env.success) == (1.0, True, True)
    env.reset(5)
    _, reward, done, _, info = env.step(ToolCall("answer", {"value": "Nowhere"}).text())
    assert (reward, done, env.success, info["tool_call"]["result"]) == (0.0, True, False, "Nowhere is wrong.")


def test_the_random_policy_writes_calls_that_parse():
    env = make_env("search_qa")
    env.reset(0)
    rng = np.random.default_rng(0)
    assert all(env.parse_action(env.sample_action(rng)) is not None for _ in range(30))


def test_options_are_checked_in_one_line():
    with pytest.raises(ValueError, match="kinds must be a comma-separated list of born, founder_born"):
        make_env("search_qa", kinds="born,spouse")
    with pytest.raises(ValueError, match="companies must be a whole number from 1 to 10"):
        make_env("search_qa", people=10, companies=11)


def test_validation_questions_start_from_entities_no_training_question_starts_from():
    env = make_env("search_qa")
    sides = {}
    for split in ("train", "val"):
        entities = set()
        for seed in split_seeds("search_qa", {}, list(range(120)), split):
            env.reset(seed)
            assert is_validation_map(env.map_key()) is (split == "val")
            entities.add(env.map_key())
        sides[split] = entities
    assert sides["val"] and sides["train"] and not sides["val"] & sides["train"]
