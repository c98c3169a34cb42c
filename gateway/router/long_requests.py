"""Long multi-step requests built from single-tool ones, for `mcp-gateway eval --long`.

Real agents send paragraphs ("find X, then do Y with it, and finally send Z"), and a
router that reads the first steps well can still lose the later ones. No public set of
such requests over a large catalog comes with labels, so they are built generically:
3 to 5 single-tool requests of a set, each needing a different tool, joined into one
paragraph (some with a connective: "Then", "After that,", ...). Their labels become the
long request's expected sets, one per step. Deterministic for a seed: the same set and
seed always give the same requests. Pure: no model, no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from gateway.router.eval import EvalQuery

__all__ = ["CONNECTIVES", "MAX_STEPS", "MIN_STEPS", "long_requests"]

MIN_STEPS = 3
MAX_STEPS = 5

CONNECTIVES = ("", "", "Also, ", "Then ", "After that, ", "Next, ", "And ", "Finally, ")
"""What may start a step after the first ("" twice: half the steps simply follow on)."""

_KEEP_CAPITAL = ("I ", "I'", "I,")


def _sentence(text: str) -> str:
    """`text` as one sentence of a paragraph: outer quotes gone, ending with punctuation."""
    text = text.strip()
    if len(text) > 1 and text[0] == text[-1] == '"':
        text = text[1:-1].strip()
    if text and text[-1] not in ".?!":
        text += "."
    return text


def _join(step: str, connective: str) -> str:
    """`connective` + `step`, its first letter lowercased unless it is "I" or an acronym."""
    if not connective or not step:
        return step
    keeps = step.startswith(_KEEP_CAPITAL) or (len(step) > 1 and step[1].isupper())
    return connective + (step if keeps else step[0].lower() + step[1:])


def long_requests(queries: Sequence[EvalQuery], *, seed: int = 0, limit: int | None = None) -> list[EvalQuery]:
    """Long requests of `MIN_STEPS`..`MAX_STEPS` steps from the single-tool `queries`.

    Each single-tool request is used at most once; the steps of one request expect
    different tools. Requests with no or several expected tools are not used. At most
    `limit` requests (all that can be made when None).
    """
    rng = random.Random(seed)
    singles = [q for q in queries if len(q.expected) == 1]
    rng.shuffle(singles)
    out: list[EvalQuery] = []
    while singles and (limit is None or len(out) < limit):
        size = rng.randint(MIN_STEPS, MAX_STEPS)
        steps: list[EvalQuery] = []
        seen: set[frozenset[str]] = set()
        rest: list[EvalQuery] = []
        for q in singles:
            if len(steps) < size and q.expected[0] not in seen:
                steps.append(q)
                seen.add(q.expected[0])
            else:
                rest.append(q)
        if len(steps) < MIN_STEPS:
            break
        singles = rest
        parts = [_sentence(steps[0].query)]
        parts += [_join(_sentence(q.query), rng.choice(CONNECTIVES)) for q in steps[1:]]
        out.append(
            EvalQuery(
                id=f"long-{len(out):04d}",
                query=" ".join(parts),
                expected=tuple(q.expected[0] for q in steps),
            )
        )
    return out
