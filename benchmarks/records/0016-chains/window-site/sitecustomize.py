"""Run with PYTHONPATH at this folder: the channel's default window becomes $WINDOW
(record 0016's window trial; both the bench and its peer process read it)."""

import os

_window = os.environ.get("WINDOW")
if _window:
    from aiordma.channel.options import ChannelOptions

    ChannelOptions.__init__.__kwdefaults__["window"] = int(_window)
