"""Conversation affinity on top of the stateless prefix policy (see `ConversationAffinity`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from router.keys import RoutingKey
from router.policy import Branch, Decision, load_cap
from router.replicas import ReplicaState

__all__ = ["ConversationAffinity"]


class ConversationAffinity:
    """Keeps a conversation of a shared (hot) prefix on the replica that served its last turn.

    The policy is stateless: once a hot prefix spills, a conversation's next turn goes to the
    first replica under the bounded-load cap in its own preference order, which changes as the
    loads move, so its history (the longest cached prefix it has) is often left behind. This
    remembers, per process, where each conversation last went (bounded LRU) and sends the next
    turn there whenever that replica is available and under the same cap the policy enforces, so
    the load bound holds unchanged. Cost: O(N) for the cap, one dict move per request.
    """

    def __init__(self, load_factor: float, size: int = 65536, load_floor: int = 0) -> None:
        self.load_factor = load_factor
        self.load_floor = load_floor
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
            available = [s for s in states if s.available]
            prev = next((s for s in available if s.name == last), None)
            if prev is not None:
                total = sum(s.load() for s in available)
                weight = sum(s.weight for s in available)  # ReplicaState keeps weights >= 1
                if prev.load() < load_cap(total, prev.weight, weight, self.load_factor,
                                          self.load_floor):
                    decision = Decision(last, Branch.CONVERSATION,
                                        (last, *(c for c in decision.candidates if c != last)),
                                        decision.home)
        self._last[conv] = decision.replica
        self._last.move_to_end(conv)
        if len(self._last) > self.size:
            self._last.popitem(last=False)
        return decision
