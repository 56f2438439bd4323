"""``riffle-ctl``: the operator's command line for a riffle cluster.

Modules: ``main`` (argument parsing and the commands), ``api`` (the coordinator's HTTP API, admin
token from ``RIFFLE_ADMIN_TOKEN``), ``tables`` (the SQL tables ``instances``, ``active_apps``,
``historical_apps`` in an in-process DuckDB), ``output`` (table / JSON / CSV output and the
pipeline input of ``instance ... --pipeline``), ``bench`` (``disk-bench``), ``inspect_file``
(``inspect``: index records and block CRCs) and ``templates`` (``config init``).

An entry point: it talks to the daemons over HTTP only and imports no daemon internals beyond
the index codec and the config models. User documentation: ``docs/ctl.md``.
"""
