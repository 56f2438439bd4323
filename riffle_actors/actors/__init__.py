"""The shuffle server's actors: memory, apps, app manager, spill dispatcher, disks, disk monitor, heartbeat.

Each module owns one actor kind and the messages it receives. They are built on the actor runtime
(``riffle_actors.runtime``) and import only its public names.
"""
