"""The tracer's checks of the peers and groups a learner's call names (``Tracer`` inherits
them): a peer outside the group the case passed, a peer or a root named by its rank in the
whole world (dst=, src=) in a group numbered otherwise, group_dst= without group=, and a
collective on the whole world when the case passed a smaller group. Each raises
``PeerOutsideGroup`` with what to change, before torch or Gloo fails in its own words (or
waits for a rank that sits the case out).

The methods use what ``Tracer`` holds: ``rank``, ``members`` (the case's global ranks, None
outside a case), ``log``, ``inside`` (a library function running), ``learner_file``,
``learner_line()``, ``called_by_learner()``, ``learner_call()`` and ``_bound()``.
"""

from __future__ import annotations

import ast
import linecache

import torch.distributed as dist

ALONE_IN_GROUP = "is alone in its group"  # a case's explain may add what alone means


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


class PeerOutsideGroup(ValueError):
    """The learner named a peer that is not in the group the case passed."""


class GroupChecks:
    """The peer and group checks of ``Tracer`` (a mixin: see the module's docstring)."""

    def _check_group(self, original, args, kwargs) -> None:
        """A collective on the whole world while the case passed a smaller group would wait
        for ranks that sit the case out, and a root named by its global rank (src=, dst=)
        may not be in the group: say so at once."""
        world = dist.get_world_size()
        if self.log is None or self.members is None or len(self.members) == world:
            return
        try:
            bound = self._bound(original, args, kwargs)
        except TypeError:
            return  # torch reports a wrong call itself
        group = bound.get("group")
        if group is None or group == dist.group.WORLD:
            outside = [r for r in range(world) if r not in self.members]
            raise PeerOutsideGroup(
                f"rank {self.rank} called {original.__name__} on the whole world, ranks "
                f"0..{world - 1}, but this case gave your function a group of ranks "
                f"{list(self.members)}: {_ranks(outside)}, outside it, never call"
                f"{'s' if len(outside) == 1 else ''} it, so it cannot finish; pass that group "
                f"to {self.learner_call(original.__name__)} (group=...)")
        for word in ("src", "dst"):  # the root of a broadcast, a reduce, ...
            if bound.get(word) is not None and bound[word] not in self.members:
                raise self._named_globally(original.__name__, word, bound[word])

    def _peer(self, name: str, original, args, kwargs):
        """(tensor, global peer rank or None, the keyword that named it) of a point-to-point
        call: dst=/src= name a rank of the whole world, group_dst=/group_src= one of the
        group (of the whole world's group when no group= is passed)."""
        bound = self._bound(original, args, kwargs)
        word = "dst" if "send" in name else "src"
        if bound.get(word) is not None:
            return bound.get("tensor"), bound[word], word
        local = bound.get("group_" + word)
        if local is None:
            return bound.get("tensor"), None, None
        group = dist.group.WORLD if bound.get("group") is None else bound["group"]
        size = dist.get_world_size(group)
        if self.members is not None and not 0 <= local < size:
            raise self._outside(f"{name} {'to' if word == 'dst' else 'from'} the group's rank "
                                f"{local}", f"the group passed to the function has {size} "
                                f"rank{'s' if size > 1 else ''} (ranks {list(self.members)})",
                                "group_" + word, size)
        peer = dist.get_global_rank(group, local)
        if group == dist.group.WORLD and self._in_a_smaller_group() and (
                peer not in self.members or peer == self.rank):
            raise self._without_group(name, f"group_{word}={local}", f"group_{word}=")
        return bound.get("tensor"), peer, "group_" + word

    def _in_a_smaller_group(self) -> bool:
        return self.members is not None and len(self.members) < dist.get_world_size()

    def _without_group(self, name: str, named: str, word: str) -> PeerOutsideGroup:
        """A peer named by its rank in the group (``named``: "group_dst=1") on a call made
        without group=, which numbers it in the whole world's group instead."""
        if self.inside or not self.called_by_learner():
            return self._sent_on_the_world()
        return PeerOutsideGroup(
            f"rank {self.rank} called {name} with {named} and no group=: {word} without "
            f"group= names a rank of the whole world's group, ranks "
            f"0..{dist.get_world_size() - 1}, and this case gave your function a group of "
            f"ranks {list(self.members)}: pass group=group too")

    def _sent_on_the_world(self) -> PeerOutsideGroup:
        """The course's code (or torch's), called by the learner without the group."""
        called = self.learner_call(self.inside or "it")
        return PeerOutsideGroup(
            f"{called} sent on the whole world, ranks 0..{dist.get_world_size() - 1}, but "
            f"this case gave your function a group of ranks {list(self.members)}: pass that "
            f"group to {called} too")

    def _outside(self, call: str, fact: str, word: str, size: int) -> PeerOutsideGroup:
        """A peer outside the case's group (``call``: "send to rank 3", ``fact``: why it is
        outside): a number written in the code, for a rank alone in its group or not, else a
        rank or a size taken from the whole world."""
        written = self._written_peer(word)
        said = f"rank {self.rank} called {call}" + (", a number written in your code"
                                                    if written is not None else "")
        if written is not None and size == 1:
            return PeerOutsideGroup(f"{said}, but {fact}: rank {self.rank} {ALONE_IN_GROUP}")
        advice = ("name the neighbour from the group's rank and size" if written is not None
                  else "take the rank and the size from that group")
        return PeerOutsideGroup(f"{said}, but {fact}: {advice}, dist.get_rank(group) and "
                                "dist.get_world_size(group)")

    def _written_peer(self, word: str) -> int | None:
        """The number the learner's line writes for the peer (``word``: dst, group_src, ...;
        dst and src also as a call's second argument), or None."""
        line = self.learner_line()
        source = linecache.getline(self.learner_file, line).strip() if line else ""
        try:
            tree = ast.parse(source)
        except SyntaxError:  # a line of a longer statement
            return None
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            values = [k.value for k in call.keywords if k.arg == word]
            if word in ("dst", "src") and len(call.args) > 1:
                values.append(call.args[1])
            for value in values:
                if isinstance(value, ast.Constant) and type(value.value) is int:
                    return value.value
        return None

    def _check_peer(self, name: str, peer, word=None) -> None:
        """``peer``: the global rank a call names, by the keyword ``word`` ("dst", "src",
        "peer" for a P2POp's, "group_dst", ...)."""
        if peer is None or self.members is None:
            return
        numbered_apart = self.members != list(range(len(self.members)))
        if word in ("dst", "src", "peer") and numbered_apart and (
                peer not in self.members or peer == self.rank):
            raise self._named_globally(name, word, peer)
        if peer in self.members:
            return
        if self.inside or not self.called_by_learner():
            raise self._sent_on_the_world()
        way = "to" if "send" in name else "from"
        raise self._outside(f"{name} {way} rank {peer}", f"it is not in the group passed to "
                            f"the function (ranks {list(self.members)})", word or "",
                            len(self.members))

    def _named_globally(self, name: str, word: str, peer: int) -> PeerOutsideGroup:
        """A peer or a root named by its rank in the whole world (``word``: dst, src or a
        P2POp's peer) in a group whose own numbers are not those."""
        what = "itself" if peer == self.rank else "not in the group"
        return PeerOutsideGroup(
            f"rank {self.rank} called {name} with {word}={peer} ({what}): {word}= is a rank "
            "of the whole world, and this case gave your function a group of ranks "
            f"{list(self.members)}, the group's ranks {list(range(len(self.members)))}: name "
            f"a rank of the group with group_{word}= and group=group")
