"""Product search: BM25 (the ``bm25s`` package) over the text the original indexes.

The original builds a Lucene (pyserini) index whose document for a product is, lowercased,
``Title + " " + Description + " " + BulletPoints[0] + " " + option text`` where the option text
is ``"color: black, white, and size: s, m"`` (see its ``convert_product_file_format.py``), and
returns the top ``SEARCH_RETURN_N`` = 50 hits. Here:

* the same document text (:func:`document_text`; a product without bullet points adds "");
* Lucene's analysis, approximately: lowercase, split on non-word characters (single letters
  and digits kept, as Lucene's StandardTokenizer keeps them), drop Lucene's 33 English stop
  words, and strip plurals with an S-stemmer (Harman's rules, as Lucene's
  EnglishMinimalStemFilter, plus -sses/-xes/-ches/-shes) instead of Porter, so no stemmer
  package is needed;
* pyserini's BM25 parameters (k1=0.9, b=0.4) with bm25s' "lucene" scoring;
* hits are the documents with a positive score (Lucene returns no others), best first, ties
  broken by catalog order, so the ranking is the same in every process and on every machine.

The index of 1,000 products builds in well under a second. Indexes of at least
``CACHE_MIN_DOCS`` documents are saved with bm25s under ``$ENVRL_CACHE/webshop/index-<key>``
(key = SHA-256 of the parameters and every document's asin and text), written to a temporary
directory and renamed into place, and loaded memory-mapped on the next start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import bm25s
import numpy as np

from envrl.envs.webshop.builtin import cache_root, no_gc

SEARCH_RETURN_N = 50
CACHE_MIN_DOCS = 10_000
INDEX_VERSION = "1"  # bump when analyze(), document_text() or the scoring changes
K1, B = 0.9, 0.4

# Lucene's EnglishAnalyzer stop set (the default of StandardAnalyzer before Lucene 8).
LUCENE_STOPWORDS = (
    "a",
    "an",
    "and",
    "are",
    "as",
    "at",
    "be",
    "but",
    "by",
    "for",
    "if",
    "in",
    "into",
    "is",
    "it",
    "no",
    "not",
    "of",
    "on",
    "or",
    "such",
    "that",
    "the",
    "their",
    "then",
    "there",
    "these",
    "they",
    "this",
    "to",
    "was",
    "will",
    "with",
)
_STOP = frozenset(LUCENE_STOPWORDS)
_WORD = re.compile(r"\w+")

logging.getLogger("bm25s").setLevel(logging.WARNING)


def s_stem(word: str) -> str:
    """A plural stripper: Harman's S-stemmer, plus ``-sses/-xes/-ches/-shes`` lose ``es``.

    ``ponies`` -> ``pony``, ``shoes`` -> ``shoe``, ``glasses`` -> ``glass``, ``boxes`` -> ``box``,
    ``watches`` -> ``watch``; ``bus``, ``dress`` unchanged.
    """
    n = len(word)
    if n < 3 or word[-1] != "s":
        return word
    if word.endswith("ies") and not word.endswith(("eies", "aies")) and n > 3:
        return word[:-3] + "y"
    if word.endswith(("sses", "xes", "ches", "shes")) and n > 4:
        return word[:-2]
    if word.endswith("es") and not word.endswith(("aes", "ees", "oes")):
        return word[:-1]
    if word.endswith(("us", "ss")):
        return word
    return word[:-1]


def analyze(text: str) -> list[str]:
    """The terms of ``text``: lowercase word tokens, stop words dropped, plurals stemmed."""
    return [s_stem(t) for t in _WORD.findall(text.lower()) if t not in _STOP]


def document_text(product: Mapping[str, Any]) -> str:
    """What the original's index holds for a product (lowercased)."""
    option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in product.get("options", {}).items())
    bullets = product.get("BulletPoints") or [""]
    return " ".join([product["Title"], product["Description"], bullets[0], option_text]).lower()


class SearchIndex:
    """BM25 over a fixed list of products; :meth:`search` returns asins, best first."""

    def __init__(self, asins: Sequence[str], retriever: bm25s.BM25):
        self.asins = list(asins)
        self.retriever = retriever

    @classmethod
    def build(
        cls,
        products: Sequence[Mapping[str, Any]],
        *,
        use_cache: bool | None = None,
        cache_dir: str | os.PathLike | None = None,
    ) -> SearchIndex:
        asins = [p["asin"] for p in products]
        texts = [document_text(p) for p in products]
        if use_cache is None:
            use_cache = len(texts) >= CACHE_MIN_DOCS
        if not use_cache:
            return cls(asins, _index(texts))
        folder = Path(cache_dir) if cache_dir is not None else cache_root()
        final = folder / f"index-{_key(asins, texts)}"
        if final.is_dir():
            try:
                return cls(asins, bm25s.BM25.load(str(final), mmap=True, show_progress=False))
            except (OSError, ValueError, KeyError):
                shutil.rmtree(final, ignore_errors=True)
        retriever = _index(texts)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=folder))
            try:
                retriever.save(str(tmp), show_progress=False)
                os.replace(tmp, final)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)  # lost a race or no space: keep in memory
        except OSError:
            pass
        return cls(asins, retriever)

    def scores(self, query: str) -> np.ndarray:
        ids = self.retriever.get_tokens_ids(analyze(query))
        if not ids:
            return np.zeros(len(self.asins), dtype=np.float32)
        return self.retriever.get_scores_from_ids(ids)

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[str]:
        """The asins of up to ``k`` products matching ``query``, best first (ties: catalog order)."""
        scores = self.scores(query)
        positive = np.flatnonzero(scores > 0)
        if positive.size > k:
            # Keep every document tied with the k-th score, then order exactly.
            kth = np.partition(scores[positive], positive.size - k)[positive.size - k]
            positive = positive[scores[positive] >= kth]
        order = np.lexsort((positive, -scores[positive]))[:k]
        return [self.asins[i] for i in positive[order]]


def _index(texts: Sequence[str]) -> bm25s.BM25:
    """A bm25s index of ``texts`` analysed by :func:`analyze` (each distinct token stemmed once)."""
    vocab: dict[str, int] = {}
    token_ids: dict[str, int] = {}  # raw token -> vocabulary id, -1 for stop words
    corpus_ids: list[list[int]] = []
    with no_gc():
        for text in texts:
            tokens = _WORD.findall(text)
            for token in set(tokens).difference(token_ids):
                token_ids[token] = -1 if token in _STOP else vocab.setdefault(s_stem(token), len(vocab))
            ids = [token_ids[t] for t in tokens]
            corpus_ids.append([i for i in ids if i >= 0])
        retriever = bm25s.BM25(k1=K1, b=B, method="lucene")
        retriever.index((corpus_ids, vocab), show_progress=False)
    return retriever


def _key(asins: Sequence[str], texts: Sequence[str]) -> str:
    h = hashlib.sha256(json.dumps({"version": INDEX_VERSION, "k1": K1, "b": B, "bm25s": bm25s.__version__}).encode())
    for asin, text in zip(asins, texts):
        h.update(asin.encode("utf-8") + b"\x00" + text.encode("utf-8") + b"\x01")
    return h.hexdigest()[:24]
