"""State shared by the replicas of one deployment (a PostgreSQL database named by `GATEWAY_DATABASE_URL`).

`database.py` is the connection and the schema, `bus.py` the change fan-out (LISTEN/NOTIFY with a
periodic resync), and one module per kind of state: `fingerprints.py` (tool fingerprints and
approvals), `switches.py` (runtime disables of tools and servers), `sessions.py` (console sessions),
`ratelimit.py` (token buckets). Without a database none of this runs: a single gateway keeps the same
state in its data dir or in memory, as `docs/deployment.md` says.
"""
