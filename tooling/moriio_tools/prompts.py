"""The tools' prompt sets: seeded random tokens, block-boundary lengths, repeated prompts."""

from __future__ import annotations

import random

SPECIAL_LENGTHS = (64, 96, 33, 65)
"""Block-aligned (64, 96) and one-past-a-block (33, 65) lengths for block size 32."""
MIN_RANDOM_LEN = 33
MAX_RANDOM_LEN = 200
TOKEN_LOW = 10  # random token ids are drawn from [TOKEN_LOW, vocab)
REPEAT_ALL_BLOCKS_MIN = 8  # from this many requests on, the 65-token prompt repeats too

Prompt = tuple[int, ...]


def build_prompts(
    requests: int, prompt_len: int | None = None, *, seed: int = 0, vocab: int = 1000
) -> list[Prompt]:
    """``requests`` prompts of random tokens.

    Without ``prompt_len`` the lengths start with :data:`SPECIAL_LENGTHS`, then are random in
    [33, 200]. The last request repeats the first prompt (with 8 or more requests the one
    before it repeats the 65-token prompt), so that the repeat, sent in a later wave, hits
    both engines' prefix caches: 64 tokens leave one block to transfer, 65 leave nothing.
    """
    if requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests}")
    if prompt_len is not None and prompt_len < 1:
        raise ValueError(f"prompt_len must be >= 1, got {prompt_len}")
    rng = random.Random(seed)
    repeats: list[int] = []
    if requests >= 2:
        repeats.append(0)
    if requests >= REPEAT_ALL_BLOCKS_MIN and prompt_len is None:
        repeats.insert(0, SPECIAL_LENGTHS.index(65))
    unique = requests - len(repeats)
    lengths = [
        prompt_len
        if prompt_len is not None
        else SPECIAL_LENGTHS[i]
        if i < len(SPECIAL_LENGTHS)
        else rng.randint(MIN_RANDOM_LEN, MAX_RANDOM_LEN)
        for i in range(unique)
    ]
    prompts = [tuple(rng.randrange(TOKEN_LOW, vocab) for _ in range(n)) for n in lengths]
    prompts += [prompts[i] for i in repeats]
    return prompts
