"""Per-process affinities on top of the stateless prefix policy: a chat conversation stays on the
replica of its last turn (`ConversationAffinity`); a completions prompt goes to the replica that
served its longest known prefix (`PromptAffinity`). Both only ever move a request to a replica
under the policy's bounded-load cap, so the load bound holds unchanged."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import xxhash

from router.keys import RoutingKey
from router.policy import Branch, Decision, LoadBound, moved_decision
from router.replicas import ReplicaState

__all__ = ["Affinities", "ConversationAffinity", "PromptAffinity"]


def move_to(decision: Decision, name: str, states: Sequence[ReplicaState],
            bound: LoadBound) -> Decision:
    """``decision`` moved to replica ``name`` (branch ``conversation``, the others kept as the
    retry order) if that replica is available and under the cap; else ``decision`` unchanged."""
    target = next((s for s in states if s.name == name and s.available), None)
    if target is None or not bound.admits(target, states):
        return decision
    return moved_decision(name, Branch.CONVERSATION, decision.candidates, decision.home)


class ConversationAffinity:
    """Keeps a conversation of a shared (hot) prefix on the replica that served its last turn.

    The policy is stateless: once a hot prefix spills, a conversation's next turn goes to the
    first replica under the bounded-load cap in its own preference order, which changes as the
    loads move, so its history (the longest cached prefix it has) is often left behind. This
    remembers, per process, where each conversation last went (bounded LRU) and sends the next
    turn there whenever that replica is available and under the same cap the policy enforces, so
    the load bound holds unchanged. Cost: O(N) for the cap, one dict move per request.
    """

    def __init__(self, bound: LoadBound, size: int = 65536) -> None:
        self.bound = bound
        self.size = size
        self._last: OrderedDict[tuple[str, str], str] = OrderedDict()

    def apply(self, key: RoutingKey, decision: Decision,
              states: Sequence[ReplicaState]) -> Decision:
        if key.conversation is None or key.prefix is None:
            return decision  # ring placement by conversation is already stable
        # scoped by prefix: a conversation id derived from a first message like "hi" is shared
        # by unrelated conversations under different system prompts
        conv = (key.prefix, key.conversation)
        last = self._last.get(conv)
        if last is not None and last != decision.replica:
            decision = move_to(decision, last, states, self.bound)
        self._last[conv] = decision.replica
        self._last.move_to_end(conv)
        if len(self._last) > self.size:
            self._last.popitem(last=False)
        return decision


class PromptAffinity:
    """Sends a completions prompt back to the replica that served its longest known prefix.

    The routing key of a raw prompt covers only its leading window (`prompt_window_chars`), so
    every prompt that starts with the same preamble - a long system prompt, a shared document -
    shares one key, and the follow-up turns of one conversation (turn N+1 resends turn N's
    prompt and appends to it) are placed like strangers once that key spills. This keeps, per
    process, a bounded LRU from each prompt chunk hash (`RoutingKey.chunks`, chained, so a
    hash stands for the whole prompt up to the end of its chunk) to the replica that last
    served a prompt containing it - an approximate radix tree at 1 KiB granularity, like
    sglang-router's cache-aware policy but without its per-character tree.

    A request goes to the replica of its deepest known chunk when that match covers more than
    `threshold` of the request's full chunks (sglang-router's `cache_threshold`, 0.5): a
    continuation follows its history. A request whose known part is a preamble followed by
    mostly new content is a new conversation: with `spread`, it goes to the replica that
    rendezvous hashing picks for its first new chunk, instead of joining every other
    conversation of that preamble on the key's home (below the load floor nothing spills, so
    their histories would evict each other in one replica's KV cache while the others stay
    empty; sglang-router sends such a request to the worker with the smallest tree). The
    preamble then costs one cold prefill per replica, once. Nothing known: the policy's
    decision stands. Every move needs the target available and under the bounded-load cap.
    Cost: at most one dict lookup and one update per chunk (<= 64), plus one hash per replica
    for a new conversation.
    """

    def __init__(self, bound: LoadBound, size: int = 1 << 17, threshold: float = 0.5,
                 spread: bool = True) -> None:
        self.bound = bound
        self.size = size
        self.spread = spread
        self.threshold = threshold
        self._where: OrderedDict[int, str] = OrderedDict()

    def apply(self, key: RoutingKey, decision: Decision,
              states: Sequence[ReplicaState]) -> Decision:
        chunks = key.chunks
        if not chunks:
            return decision
        where = self._where
        known, name = 0, None
        for depth in range(len(chunks), 0, -1):
            name = where.get(chunks[depth - 1])
            if name is not None:
                known = depth
                break
        if name is not None and known > self.threshold * len(chunks):
            if name != decision.replica:
                decision = move_to(decision, name, states, self.bound)
        elif self.spread and 0 < known < len(chunks):
            # a known preamble followed by mostly new content: a new conversation. Place it by
            # its first new chunk (rendezvous over the available replicas), not with every
            # other conversation of the preamble on the key's home, so that their histories
            # spread over the fleet's KV caches; the preamble costs one cold prefill per replica.
            novel = chunks[known]
            target = max((s for s in states if s.available),
                         key=lambda s: xxhash.xxh3_64_intdigest(s.name.encode(), seed=novel),
                         default=None)
            if target is not None and target.name != decision.replica:
                decision = move_to(decision, target.name, states, self.bound)
        chosen = decision.replica
        for h in chunks:
            where[h] = chosen
            where.move_to_end(h)
        while len(where) > self.size:
            where.popitem(last=False)
        return decision


class Affinities:
    """The affinities the app applies after the policy, in order (the simulator uses this too)."""

    def __init__(self, bound: LoadBound, prompt: bool = True) -> None:
        self.conversation = ConversationAffinity(bound)
        self.prompt = PromptAffinity(bound) if prompt else None

    def apply(self, key: RoutingKey, decision: Decision,
              states: Sequence[ReplicaState]) -> Decision:
        decision = self.conversation.apply(key, decision, states)
        if self.prompt is not None:
            decision = self.prompt.apply(key, decision, states)
        return decision
