"""Pure byte codecs; no asyncio, sockets or actors.

This package owns every byte-level format the server shares with Uniffle clients and
Riffle: the Java ``Roaring64NavigableMap`` legacy bitmap (``bitmap``), the 40-byte index
record (``index``), the block-id bit layout (``blockid``) and the ``ProtocolError`` all
decoders raise (``errors``). Generated gRPC code lives in ``proto/`` and is never edited
by hand. Nothing here imports asyncio, sockets or actors, so every codec is unit-tested
with plain bytes.
"""
