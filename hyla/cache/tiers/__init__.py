"""Tiers below the device pool (host memory, local disk, a remote Redis/Valkey store) holding
KV blocks and linear-state checkpoints under the prefix cache's block hashes."""

from hyla.cache.tiers.disk import DiskTier
from hyla.cache.tiers.host import HostTier
from hyla.cache.tiers.index import TieredPrefix, Transfers
from hyla.cache.tiers.remote import RemoteTier
from hyla.cache.tiers.store import Tier, TierStats

__all__ = ["DiskTier", "HostTier", "RemoteTier", "Tier", "TierStats", "TieredPrefix", "Transfers"]
