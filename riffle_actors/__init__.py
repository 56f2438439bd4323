"""riffle_actors: a Uniffle-compatible remote shuffle server on an in-process asyncio actor runtime."""

__version__ = "0.1.0"
