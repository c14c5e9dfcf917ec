"""Descriptor lists: blocks of one agent's registered memory, in a compact, sendable form.

A :class:`DescriptorList` names ``len(list)`` blocks (address, length) of
one agent's registered regions. Its owner makes it from a registration
(:meth:`Registration.blocks`, :meth:`Registration.descriptors`); slicing,
``take`` and ``+`` make others without copying the memory. ``to_bytes``
packs it (the regions it touches with their rkeys, then three arrays: 20
bytes a block) for a peer, who rebuilds it with :meth:`DescriptorList.from_bytes`
and names it as the remote side of a transfer. Every block lies inside its
region: lists are checked when they are made and when they are unpacked,
so a transfer checks regions, not blocks.
"""

from __future__ import annotations

import operator
import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple, overload

from aiordma._checks import check_bytes_like
from aiordma.exceptions import ProtocolError
from aiordma.transfer import _plan

MAGIC: Final = b"ADL1"
_HEADER: Final = struct.Struct("<4sHHQII")
_REGION: Final = struct.Struct("<QQII")
_REMOTE: Final = 1
"""Header flag: the list was unpacked (its regions' keys are rkeys)."""
MAX_BLOCKS: Final = 1 << 24
"""Blocks a packed list may hold (a bound on what unpacking allocates)."""


@dataclass(frozen=True, slots=True)
class RegionInfo:
    """One registered region as a descriptor list sees it."""

    base: int
    length: int
    lkey: int
    """0 in a list a peer sent (it is of no use outside its agent)."""
    rkey: int
    """0 when the region has local access only."""
    access: int
    """The region's :class:`~aiordma.Access` flags."""


class Descriptor(NamedTuple):
    """One block: where it is, how long, and its region's key (lkey locally, rkey remotely)."""

    addr: int
    length: int
    key: int


def _is_int(value: object) -> bool:
    """Whether ``value`` is a whole number (an int, or a numpy integer), not a bool."""
    return hasattr(type(value), "__index__") and not isinstance(value, bool)


def _u64(values: Iterable[int], what: str) -> array[int]:
    try:
        return array("Q", values)
    except OverflowError:
        raise ValueError(f"{what} must be whole numbers from 0 to 2**64 - 1") from None


class DescriptorList(Sequence[Descriptor]):
    """Blocks of one agent's registered memory (see the module's docstring).

    Equal lists compare equal; ``len()`` is the number of blocks,
    :attr:`nbytes` their total length.
    """

    __slots__ = ("addrs", "agent", "lengths", "region_of", "regions", "remote")

    def __init__(
        self, agent: int, regions: tuple[RegionInfo, ...], addrs: array[int],
        lengths: array[int], index: array[int], *, remote: bool = False,
    ) -> None:  # fmt: skip
        """Internal: lists come from registrations, slicing and :meth:`from_bytes`.
        Raises ValueError if a block is outside its region."""
        if not len(addrs) == len(lengths) == len(index):
            raise ValueError("a descriptor list needs one address, length and region per block")
        self.agent = agent
        """The id of the agent whose memory this is."""
        self.regions = regions
        self.addrs = addrs
        self.lengths = lengths
        self.region_of = index
        """Each block's region, as an index into ``regions``."""
        self.remote = remote
        """True for a list unpacked from bytes (a peer's memory)."""
        self._check()

    def _check(self) -> None:
        count = len(self.regions)
        for i, (addr, length, region) in enumerate(
            zip(self.addrs, self.lengths, self.region_of, strict=True)
        ):
            if region >= count:
                raise ValueError(f"descriptor {i} names region {region} of {count}")
            info = self.regions[region]
            if length == 0:
                raise ValueError(f"descriptor {i} at {addr:#x} is empty: a block is at least "
                                 "one byte")  # fmt: skip
            if addr < info.base or addr + length > info.base + info.length:
                raise ValueError(
                    f"descriptor {i} ({length} bytes at {addr:#x}) is outside its region "
                    f"({info.length} bytes at {info.base:#x})"
                )

    @classmethod
    def trusted(
        cls, agent: int, regions: tuple[RegionInfo, ...], addrs: array[int],
        lengths: array[int], index: array[int],
    ) -> DescriptorList:  # fmt: skip
        """Internal: a local list whose blocks the caller placed inside their regions."""
        new = object.__new__(cls)
        new.agent, new.regions, new.remote = agent, regions, False
        new.addrs, new.lengths, new.region_of = addrs, lengths, index
        return new

    @classmethod
    def spans(
        cls, agent: int, region: RegionInfo, spans: Iterable[tuple[int, int]]
    ) -> DescriptorList:
        """Internal: a local list of ``(offset, length)`` spans of one region."""
        offsets: list[int] = []
        lengths: list[int] = []
        for i, (offset, length) in enumerate(spans):
            if not _is_int(offset) or not _is_int(length):
                raise TypeError(f"descriptor {i}: offset and length must be ints, not "
                                f"{type(offset).__name__} and {type(length).__name__}")  # fmt: skip
            offset, length = operator.index(offset), operator.index(length)
            if offset < 0 or length < 0:
                raise ValueError(f"descriptor {i}: offset {offset} and length {length} "
                                 "must not be negative")  # fmt: skip
            if length == 0:
                raise ValueError(f"descriptor {i} at offset {offset} is empty: a block "
                                 "is at least one byte")  # fmt: skip
            offsets.append(region.base + offset)
            lengths.append(length)
        addrs = _u64(offsets, "addresses")
        return cls(agent, (region,), addrs, _u64(lengths, "lengths"),
                   array("I", bytes(4 * len(addrs))))  # fmt: skip

    # -- the sequence --------------------------------------------------------

    def __len__(self) -> int:
        return len(self.addrs)

    @overload
    def __getitem__(self, key: int) -> Descriptor: ...
    @overload
    def __getitem__(self, key: slice) -> DescriptorList: ...
    def __getitem__(self, key: int | slice) -> Descriptor | DescriptorList:
        if isinstance(key, slice):
            return self._derive(self.addrs[key], self.lengths[key], self.region_of[key])
        info = self.regions[self.region_of[key]]
        return Descriptor(
            self.addrs[key], self.lengths[key], info.rkey if self.remote else info.lkey
        )

    def _derive(self, addrs: array[int], lengths: array[int], index: array[int]) -> DescriptorList:
        new = object.__new__(DescriptorList)
        new.agent, new.regions, new.remote = self.agent, self.regions, self.remote
        new.addrs, new.lengths, new.region_of = addrs, lengths, index
        return new

    def take(self, indices: Iterable[int]) -> DescriptorList:
        """The blocks at ``indices``, in that order (e.g. scattered cache blocks)."""
        picked = list(indices)
        count = len(self.addrs)
        for n, i in enumerate(picked):
            if not _is_int(i):
                raise TypeError(f"take() takes block indices (ints), not {type(i).__name__}")
            picked[n] = i = operator.index(i)
            if not -count <= i < count:
                raise IndexError(f"block {i} of a list of {count}")
        return self._derive(array("Q", [self.addrs[i] for i in picked]),
                            array("Q", [self.lengths[i] for i in picked]),
                            array("I", [self.region_of[i] for i in picked]))  # fmt: skip

    def split(self, size: int) -> DescriptorList:
        """Every block cut into ``size``-byte blocks (a block's last one shorter):
        a peer's one exported region carved into the blocks a transfer names."""
        if not _is_int(size):
            raise TypeError(f"block size must be an int, not {type(size).__name__}")
        if size <= 0:
            raise ValueError(f"block size {size} must be positive")
        addrs, lengths, index = array("Q"), array("Q"), array("I")
        for addr, length, region in zip(self.addrs, self.lengths, self.region_of, strict=True):
            count = max(1, -(-length // size))
            addrs.extend(range(addr, addr + count * size, size))
            lengths.extend([size] * (count - 1))
            lengths.append(length - (count - 1) * size)
            index.extend([region] * count)
        return self._derive(addrs, lengths, index)

    def __add__(self, other: object) -> DescriptorList:
        if not isinstance(other, DescriptorList):
            return NotImplemented
        if other.agent != self.agent or other.remote != self.remote:
            raise ValueError("only lists of the same agent's memory, both local or both "
                             "remote, can be joined")  # fmt: skip
        regions = list(self.regions)
        remap = array("I")
        for info in other.regions:
            if info not in regions:
                regions.append(info)
            remap.append(regions.index(info))
        index = array("I", self.region_of)
        index.extend(remap[i] for i in other.region_of)
        return self._derive(self.addrs + other.addrs, self.lengths + other.lengths, index)._with(
            tuple(regions)
        )

    def _with(self, regions: tuple[RegionInfo, ...]) -> DescriptorList:
        self.regions = regions
        return self

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DescriptorList):
            return NotImplemented
        return self._key() == other._key()

    def _key(self) -> tuple[object, ...]:
        return (self.agent, self.remote, list(self), [self.regions[i] for i in self.region_of])

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        side = "remote" if self.remote else "local"
        return (f"<DescriptorList {len(self)} blocks, {self.nbytes} bytes, {side}, "
                f"agent {self.agent:#x}>")  # fmt: skip

    @property
    def nbytes(self) -> int:
        """The blocks' total length."""
        return sum(self.lengths)

    # -- checks before a transfer --------------------------------------------

    def check_pairs(self, remote: DescriptorList) -> None:
        """ValueError unless this list and ``remote`` pair block for block
        (as many blocks, at least one, each pair of one length)."""
        count = len(self)
        if len(remote) != count:
            raise ValueError(f"{count} local blocks cannot pair with {len(remote)} remote ones")
        if not count:
            raise ValueError("the lists are empty: a transfer moves at least one block")
        bad = _plan.mismatch(self.lengths, remote.lengths, count)
        if bad >= 0:
            raise ValueError(f"descriptor {bad}: {self.lengths[bad]} local bytes, "
                             f"{remote.lengths[bad]} remote")  # fmt: skip

    def check_remote(self, agent: int | None, access: int, what: str) -> None:
        """ValueError unless this is a peer's list (of ``agent``'s memory,
        when known) whose every region allows ``access`` (named ``what``)."""
        if not self.remote:
            raise ValueError("the remote list must be a peer's (DescriptorList.from_bytes)")
        if agent is not None and self.agent != agent:
            raise ValueError(f"the remote list is agent {self.agent:#x}'s memory, "
                             f"not the peer's ({agent:#x})")  # fmt: skip
        for info in self.regions:
            if not info.access & access:
                raise ValueError(f"the peer's region at {info.base:#x} does not allow {what}")

    # -- the packed form -----------------------------------------------------

    def to_bytes(self) -> bytes:
        """Pack for a peer: the regions (with rkeys, not lkeys) and 20 bytes a block.

        Raises ValueError when a region has local access only (a peer could not use it).
        """
        for info in self.regions:
            if not info.rkey:
                raise ValueError(f"region at {info.base:#x} has local access only: register "
                                 "it with remote= to let peers use its blocks")  # fmt: skip
        parts = [_HEADER.pack(MAGIC, 1, 0, self.agent, len(self.regions), len(self))]
        parts += [_REGION.pack(r.base, r.length, r.rkey, r.access) for r in self.regions]
        arrays: list[array[int]] = [self.addrs, self.lengths, self.region_of]
        if sys.byteorder == "big":  # pragma: no cover - the packed form is little-endian
            arrays = [array(a.typecode, a) for a in arrays]
            for a in arrays:
                a.byteswap()
        parts += [a.tobytes() for a in arrays]
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> DescriptorList:
        """Unpack what :meth:`to_bytes` made (a peer's blocks). Raises
        :class:`~aiordma.ProtocolError` naming what is malformed."""
        check_bytes_like("data", data)
        view = memoryview(data).cast("B")
        if len(view) < _HEADER.size:
            raise ProtocolError(f"a descriptor list is at least {_HEADER.size} bytes, "
                                f"got {len(view)}")  # fmt: skip
        magic, version, _flags, agent, nregions, count = _HEADER.unpack_from(view)
        if magic != MAGIC or version != 1:
            raise ProtocolError("not a packed descriptor list (wrong magic or version)")
        if count > MAX_BLOCKS:
            raise ProtocolError(
                f"a packed descriptor list of {count} blocks (at most {MAX_BLOCKS})"
            )
        expected = _HEADER.size + nregions * _REGION.size + 20 * count
        if len(view) != expected:
            raise ProtocolError(f"a descriptor list of {nregions} regions and {count} blocks "
                                f"is {expected} bytes, got {len(view)}")  # fmt: skip
        at = _HEADER.size
        regions = []
        for _ in range(nregions):
            base, length, rkey, access = _REGION.unpack_from(view, at)
            regions.append(RegionInfo(base, length, 0, rkey, access))
            at += _REGION.size
        arrays: list[array[int]] = []
        for code, size in (("Q", 8), ("Q", 8), ("I", 4)):
            a = array(code)
            a.frombytes(view[at : at + size * count])
            if sys.byteorder == "big":  # pragma: no cover
                a.byteswap()
            arrays.append(a)
            at += size * count
        try:
            return cls(agent, tuple(regions), *arrays, remote=True)
        except ValueError as exc:
            raise ProtocolError(f"malformed descriptor list: {exc}") from None
