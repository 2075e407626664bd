"""Tiers below the device pool (host, disk, Redis/Valkey) for KV blocks and state checkpoints."""

from hyla.cache.tiers.disk import DiskTier
from hyla.cache.tiers.host import HostTier
from hyla.cache.tiers.index import TieredPrefix, Transfers
from hyla.cache.tiers.remote import RemoteTier
from hyla.cache.tiers.store import Tier, TierStats

__all__ = ["DiskTier", "HostTier", "RemoteTier", "Tier", "TierStats", "TieredPrefix", "Transfers"]
