"""Pure, synchronous state of the shuffle server: no asyncio, no IO, unit-tested without a loop.

Actors own one of these objects each and only route messages to it.
"""
