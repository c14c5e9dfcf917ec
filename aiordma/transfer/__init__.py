"""Transfer agents: batched one-sided transfers of descriptor lists, awaited, with notifications.

The pattern of KV-cache and block servers: each process is an
:class:`Agent` that registers memory and hands out its blocks as
:class:`DescriptorList` s (compact bytes a peer can be sent any way); a
peer reads or writes a whole list of blocks in one await, optionally
telling the owner once the data is in place (:meth:`Agent.notifications`).
Posting runs in compiled code from the completion drain: no thread, no
polling, no Python per block.
"""

from __future__ import annotations

from aiordma.exceptions import TransferError
from aiordma.transfer.agent import (
    Agent,
    AgentKeywords,
    Notification,
    start_agent,
)
from aiordma.transfer.descriptors import Descriptor, DescriptorList, RegionInfo
from aiordma.transfer.peers import Peer
from aiordma.transfer.registration import Registration

__all__ = [
    "Agent",
    "AgentKeywords",
    "Descriptor",
    "DescriptorList",
    "Notification",
    "Peer",
    "RegionInfo",
    "Registration",
    "TransferError",
    "start_agent",
]
