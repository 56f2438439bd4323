"""``riffle-ctl config template server|coordinator``: commented starter configs the daemons accept.

Each template sets the keys an operator must decide and explains the most common others in
comments; ``config/*.example.toml`` lists every key. ``tests/ctl`` loads both templates with the
daemons' own loaders and starts real daemons with them.
"""

from __future__ import annotations

SERVER = '''\
# riffle-server starter config (riffle-ctl config template server).
# Every option, with its default: config/server.example.toml. Unknown keys are refused at start.

# Where executors reach this server. 0.0.0.0 = every interface.
grpc_port = 19999
grpc_bind_address = "0.0.0.0"
# urpc_port = 20000            # Netty data port for spark.rss.client.type=GRPC_NETTY (off when unset)
http_port = 20010              # /metrics, /health, /apps
http_bind_address = "0.0.0.0"  # 127.0.0.1 keeps metrics and listings on this host

# The coordinators this server heartbeats to (host:grpcPort of each).
coordinator_quorum = ["127.0.0.1:21000"]
# tags = ["ssd"]               # extra tags, matched by spark.rss.client.assignment.tags
heartbeat_interval_seconds = 10
grace_period_sec = 30          # on SIGTERM: time to flush memory to disk

store_type = "MEMORY_LOCALFILE"

[memory_store]
capacity = "8G"                # shuffle data held in memory before it spills

[localfile_store]
# One directory per disk; the server creates them.
data_paths = ["/var/lib/riffle/data1"]
# min_number_of_available_disks = 1

[hybrid_store]
memory_spill_high_watermark = 0.8
memory_spill_low_watermark = 0.2

[log]
# path = "/var/log/riffle/server.log"   # unset = stderr
level = "INFO"

# [admin]                      # credentials of state-changing HTTP endpoints; prefer RIFFLE_ADMIN_TOKEN
# token_file = "/etc/riffle/admin.token"

# [metrics]                    # optional push to a Prometheus Pushgateway (/metrics is always there)
# push_gateway_endpoint = "http://pushgateway:9091"
# push_interval_sec = 10
# labels = { cluster = "prod" }
'''

COORDINATOR = '''\
# riffle-coordinator starter config (riffle-ctl config template coordinator).
# Every option, with its default: config/coordinator.example.toml. Unknown keys are refused at start.

grpc_port = 21000              # servers and Spark drivers (spark.rss.coordinator.quorum)
grpc_bind_address = "0.0.0.0"
http_port = 21001              # JSON API, status page (/), /metrics, riffle-ctl
http_bind_address = "0.0.0.0"  # 127.0.0.1 keeps the API and the status page on this host

assignment_strategy = "partition_balance"   # or "basic"
assignment_host_strategy = "prefer_diff"    # or "must_diff", "none"
max_assignment_servers = 9
# exclude_nodes_file = "excluded-servers.txt"   # one server id a line; re-read on change

[server]
heartbeat_timeout_sec = 30     # a server silent this long is dropped (LOST)
# allowed_networks = ["10.0.0.0/8"]

[app]
heartbeat_timeout_sec = 60     # an app silent this long moves to the history
history_size = 1000

[client_conf]                  # pushed to Spark clients (fetchClientConf)
"rss.storage.type" = "MEMORY_LOCALFILE"

[log]
# path = "/var/log/riffle/coordinator.log"   # unset = stderr
level = "INFO"

# [admin]                      # needed by riffle-ctl's instance commands; prefer RIFFLE_ADMIN_TOKEN
# token_file = "/etc/riffle/admin.token"

# [metrics]                    # optional push to a Prometheus Pushgateway (/metrics is always there)
# push_gateway_endpoint = "http://pushgateway:9091"
# push_interval_sec = 10
'''

TEMPLATES = {"server": SERVER, "coordinator": COORDINATOR}
