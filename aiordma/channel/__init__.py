"""Layer 3: message channels with credit flow control and rendezvous.

A :class:`~aiordma.channel.channel.MessageChannel` runs on any
:class:`~aiordma.channel.link.Link` (a connection), using public names of
:mod:`aiordma.cm` and :mod:`aiordma.verbs` only. ``wire``, ``credits`` and
``state`` are pure protocol logic with host tests.
"""
