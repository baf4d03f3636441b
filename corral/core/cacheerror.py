"""The data caches' policies and error, apart from corral.core.cache: a shell checks
`--cache-policy` and reports a bad cache in one line without importing the caches."""

from __future__ import annotations

#: lru (cache-oblivious) or silod (gain per GB): corral.core.cache.
CACHE_POLICIES = ("silod", "lru")


class CacheError(ValueError):
    """A cache configuration that cannot be used (message is one line)."""
