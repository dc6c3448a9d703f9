from specdec.cache.kv import KVCache

__all__ = ["KVCache"]
