"""The topic-structure paper's own words (Li, Li & Risteski, ICML 2023), quoted from the text available to
tdyn (/work/shared/papers/topic_structure_li_li_risteski_2023.txt: the project page; the abstract as quoted in
the spec, docs/reproductions/topic.md#what-the-paper-states), for the ``quote=`` and ``paper=`` of the
reproductions' paper claims. The paper's body (theorems, figures) is not available: a claim about it is
tdyn's reading of these words, and says so."""

from __future__ import annotations

#: the value / attention layer learns the topics (TL;DR) and, in stage 1, only W_V moves (Main conceptual idea)
VALUE = ("We prove that the embedding layer or attention layer alone can learn to encode topic structure. […] in "
         "stage 1, only the value matrix changes significantly")
VALUE_WHERE = ("project page: TL;DR and 'Main conceptual idea' (the body's stage-1 statement — likely a "
               "block-structured optimal W_V — is not in the available text; docs/reproductions/topic.md#stage-1-value-blocks)")

#: same-topic attention and embedding similarity (Main theoretical results)
SIMILARITY = ("between same-topic words, the embeddings should be more similar, and the average pairwise attention "
              "should be larger")
EMBEDDING = ("We prove that the embedding layer or attention layer alone can learn to encode topic structure. […] "
             "between same-topic words, the embeddings should be more similar")
SIMILARITY_WHERE = ("project page: TL;DR and 'Main theoretical results'; the abstract's 'higher average pairwise "
                    "attention' / 'higher average inner product of embeddings between same-topic words' "
                    "(docs/reproductions/topic.md#what-the-paper-states)")

#: two stages under SGD or Adam (Main conceptual idea)
TWO_STAGES = ("in stage 1, only the value matrix changes significantly; in stage 2, the key and query matrices catch "
              "up much later, even though all components are jointly optimized through standard SGD or Adam")
TWO_STAGES_WHERE = "project page: 'Main conceptual idea' (docs/reproductions/topic.md#two-stage-mechanism)"
