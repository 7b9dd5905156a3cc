"""Child process of tests/test_canonical_hostile.py: canonicalize hostile values until done.

Every value is built so that some code the walk might call back into (``__repr__``, ``__str__``,
``__eq__``, ``__hash__``, ``__iter__``, ``__len__``, ``__getitem__``, ``__index__``,
``__float__``, a finalizer run by the garbage collector) mutates or frees the containers being
walked. A memory-safety bug shows up as the process dying on a signal (the parent checks the
exit status), and ``PYTHONMALLOC=debug`` (set by the parent) poisons freed memory so that a
stale read is caught rather than silently reading the old bytes.

Each call must either return or raise ``fencepost.InvalidArgument``; anything else is printed
and makes the exit status 1. The last line printed is ``ok <returned> <refused>``.

Usage: python -m tests.hostile_walk SEED ITERATIONS
"""

from __future__ import annotations

import contextlib
import gc
import random
import sys
from collections.abc import Callable
from typing import Any

import fencepost as fp

# One large key (freed with munmap when the dict holding it goes) and a few small ones.
BIG = "k" * (2 << 20)


class World:
    """The structure under walk, so that hostile hooks can reach and mutate it."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.containers: list[Any] = []
        self.busy = False

    def mutate(self) -> None:
        """Clear, shrink or grow a random container of the value being walked.

        Uses the base classes' methods, so that a hostile subclass's own hooks are not re-entered.
        """
        if self.busy or not self.containers:
            return
        self.busy = True
        try:
            target = self.rng.choice(self.containers)
            action = self.rng.randrange(4)
            if isinstance(target, dict):
                if action == 0:
                    dict.clear(target)
                elif action == 1 and dict.__len__(target):
                    dict.popitem(target)
                else:
                    for i in range(50):
                        grown = f"grown-{i}-" + "x" * self.rng.randrange(4096)
                        dict.__setitem__(target, grown, [i])
            elif isinstance(target, list):
                if action == 0:
                    list.clear(target)
                elif action == 1 and list.__len__(target):
                    list.__delitem__(target, 0)
                else:
                    list.extend(target, [["grown"] * 8 for _ in range(50)])
        except Exception:
            pass  # a hostile key's own __eq__/__hash__ may fail inside dict operations
        finally:
            self.busy = False


def hooks(world: World) -> dict[str, Callable[..., Any]]:
    def mutating(result: Any) -> Callable[..., Any]:
        def method(self: Any, *args: Any) -> Any:
            world.mutate()
            return result

        return method

    return {
        "__repr__": mutating("hostile"),
        "__str__": mutating("hostile"),
        "__eq__": mutating(False),
        "__hash__": mutating(7),
        "__len__": mutating(3),
        "__iter__": lambda self: (world.mutate(), iter([1, 2]))[1],
        "__getitem__": mutating(1),
        "__index__": mutating(3),
        "__float__": mutating(1.5),
    }


def classes(world: World) -> dict[str, type]:
    h = hooks(world)
    plain = {k: v for k, v in h.items() if k not in ("__len__", "__iter__", "__getitem__")}
    return {
        "Key": type("Key", (), plain),
        "StrKey": type("StrKey", (str,), dict(plain)),
        "BigInt": type("BigInt", (int,), {k: h[k] for k in ("__repr__", "__str__", "__index__")}),
        "Float": type("Float", (float,), {k: h[k] for k in ("__repr__", "__float__")}),
        "Str": type("Str", (str,), {k: h[k] for k in ("__repr__", "__str__", "__len__")}),
        "List": type("List", (list,), {k: h[k] for k in ("__iter__", "__len__", "__getitem__")}),
        "Tuple": type("Tuple", (tuple,), {k: h[k] for k in ("__iter__", "__len__")}),
        "Dict": type(
            "Dict",
            (dict,),
            {
                "__iter__": h["__iter__"],
                "__len__": h["__len__"],
                "keys": lambda self: (world.mutate(), [])[1],
                "items": lambda self: (world.mutate(), [])[1],
            },
        ),
        "Unsupported": type("Unsupported", (), plain),
    }


class Finalizer:
    """Garbage in a reference cycle whose finalizer mutates the world when collected."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.me = self

    def __del__(self) -> None:
        self.world.mutate()


def build(world: World, cls: dict[str, type], depth: int) -> Any:
    rng = world.rng
    kind = rng.randrange(12 if depth < 4 else 6)
    if kind == 0:
        return rng.choice([None, True, False, 1.25, "plain", "\ud800", 2**70])
    if kind == 1:
        return cls["BigInt"](rng.choice([5, 2**60, 2**70, -(2**80)]))
    if kind == 2:
        return cls["Float"](rng.choice([0.5, float("nan"), float("inf")]))
    if kind == 3:
        return cls["Str"](rng.choice(["s", "\udfff", "é" * 100]))
    if kind == 4:
        return cls["Unsupported"]()
    if kind == 5:
        return "v" * rng.randrange(0, 2000)
    if kind in (6, 7, 8):
        d: dict[Any, Any] = cls["Dict"]() if kind == 8 else {}
        for _ in range(rng.randrange(1, 5)):
            key_kind = rng.randrange(6)
            if key_kind == 0:
                key: Any = cls["Key"]()
            elif key_kind == 1:
                key = cls["StrKey"](rng.choice(["a", "b", "\ud800", BIG]))
            elif key_kind == 2:
                key = BIG + str(rng.randrange(1000))
            else:
                key = f"k{rng.randrange(1000)}"
            with contextlib.suppress(RuntimeError):
                d[key] = build(world, cls, depth + 1)
        world.containers.append(d)
        return d
    items = [build(world, cls, depth + 1) for _ in range(rng.randrange(1, 5))]
    if kind == 9:
        world.containers.append(items)
        return items
    if kind == 10:
        lst = cls["List"](items)
        world.containers.append(lst)
        return lst
    return cls["Tuple"](items)


def main() -> int:
    seed, iterations = int(sys.argv[1]), int(sys.argv[2])
    gc.set_threshold(1, 1, 1)  # collect as often as CPython allows
    returned = refused = 0
    ledger = fp.Ledger.open(":memory:")
    calls: list[Callable[[Any], Any]] = [fp.digest, fp.canonical_json, ledger.put_json]
    for i in range(iterations):
        world = World(random.Random(seed * 1_000_003 + i))
        cls = classes(world)
        value = {BIG: build(world, cls, 0), "tail": build(world, cls, 0)}
        world.containers.append(value)
        for _ in range(3):
            Finalizer(world)  # cyclic garbage for the collector to find mid-walk
        call = calls[i % len(calls)]
        try:
            call(value)
            returned += 1
        except fp.InvalidArgument:
            refused += 1
        except BaseException as e:
            print(f"iteration {i}: {call.__name__} raised {type(e).__name__}: {e}")
            return 1
    ledger.close()
    print(f"ok {returned} {refused}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
