"""The HDFS tier's decisions (state.tier_policy) and file names (protocol.hdfs_layout)."""

from __future__ import annotations

import pytest

from riffle_actors.protocol.hdfs_layout import file_pair, partition_dir, server_prefix, split_remote_path
from riffle_actors.state.tier_policy import HdfsHealth, Tier, TierReason, TierRules, choose_tier

RULES = TierRules(hdfs_enabled=True, cold_threshold_bytes=100, huge_to_hdfs_bytes=50, retry_after_s=30)


def choose(rules=RULES, *, batch=10, huge=False, disks=2, remote=True, healthy=True):
    return choose_tier(rules, batch_bytes=batch, huge=huge, healthy_disks=disks, has_remote=remote,
                       hdfs_healthy=healthy)


def test_default_is_local():
    assert choose() == (Tier.LOCALFILE, TierReason.LOCALFILE)


def test_without_hdfs_or_remote_storage_everything_stays_local():
    assert choose(TierRules(), batch=10**9, huge=True, disks=0) == (Tier.LOCALFILE, TierReason.LOCALFILE)
    assert choose(batch=10**9, huge=True, disks=0, remote=False) == (Tier.LOCALFILE, TierReason.NO_REMOTE_STORAGE)


def test_huge_partition_above_its_threshold_goes_to_hdfs():
    assert choose(batch=51, huge=True) == (Tier.HDFS, TierReason.HUGE_PARTITION)
    assert choose(batch=50, huge=True) == (Tier.LOCALFILE, TierReason.LOCALFILE)  # strictly above, as Riffle
    assert choose(batch=51, huge=False) == (Tier.LOCALFILE, TierReason.LOCALFILE)
    unset = TierRules(hdfs_enabled=True)
    assert choose(unset, batch=10**9, huge=True) == (Tier.LOCALFILE, TierReason.LOCALFILE)


def test_cold_threshold_and_no_healthy_disk_go_to_hdfs():
    assert choose(batch=101) == (Tier.HDFS, TierReason.COLD_THRESHOLD)
    assert choose(disks=0) == (Tier.HDFS, TierReason.NO_HEALTHY_DISK)


def test_unhealthy_hdfs_falls_back_to_local():
    for kwargs in ({"batch": 101}, {"batch": 51, "huge": True}, {"disks": 0}):
        assert choose(healthy=False, **kwargs) == (Tier.LOCALFILE, TierReason.HDFS_UNHEALTHY)


def test_memory_hdfs_always_uses_hdfs():
    rules = TierRules(hdfs_enabled=True, local_enabled=False)
    assert choose(rules, disks=0, healthy=False) == (Tier.HDFS, TierReason.MEMORY_HDFS)


def test_hdfs_health_recovers_after_the_retry_interval():
    h = HdfsHealth(retry_after_s=30)
    assert h.healthy(0)
    h.failed(100.0, "boom")
    assert not h.healthy(129.9) and h.healthy(130.0)
    assert h.consecutive_failures == 1 and h.last_error == "boom"
    h.succeeded()
    assert h.healthy(100.0) and h.consecutive_failures == 0 and h.failures_total == 1


def test_file_names_follow_the_uniffle_layout():
    pair = file_pair("/rss", "application_1_2", 3, 7, "10.0.0.1-19999-20000", 2, 1)
    assert pair.data == "/rss/application_1_2/3/7-7/10.0.0.1-19999-20000_2_1.data"
    assert pair.index == "/rss/application_1_2/3/7-7/10.0.0.1-19999-20000_2_1.index"
    assert partition_dir("/", "a", 0, 0) == "/a/0/0-0"
    assert server_prefix("h-1") == "h-1_"
    with pytest.raises(ValueError):
        file_pair("/rss", "a", 0, 0, "", 0, 0)


def test_remote_paths():
    assert split_remote_path("hdfs://nn:8020/rss/data/") == ("hdfs://nn:8020", "/rss/data")
    assert split_remote_path("hdfs://nn") == ("hdfs://nn", "/")
    assert split_remote_path("/rss") == ("", "/rss")
    with pytest.raises(ValueError):
        split_remote_path("s3a://bucket/x")
