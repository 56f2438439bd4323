"""``riffle-ctl``: the operator's command line for a riffle cluster.

Modules: ``main`` (argument parsing and the commands), ``api`` (the coordinator's HTTP API, admin
token from ``RIFFLE_ADMIN_TOKEN``), ``tables`` (the SQL tables ``instances``, ``active_apps``,
``historical_apps`` in an in-process DuckDB), ``output`` (table / JSON lines / CSV output and the
pipeline input of ``instance ...`` on stdin), ``bench`` (``bench disk append|read|profile``,
``bench hdfs append``), ``inspect_file`` (``inspect file``: index records and block CRCs) and
``templates`` (``config template``). The command shapes are Riffle's ``riffle-ctl``.

An entry point: it talks to the daemons over HTTP only and imports no daemon internals beyond
the index codec and the config models. User documentation: ``docs/ctl.md``.
"""
