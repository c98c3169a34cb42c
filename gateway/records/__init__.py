"""Execution records: every proxied call and search, feedback on results, stats (docs/records.md).

store       the `RecordStore` interface and the SQL both backends share
sqlite      the default backend: a WAL file in the data dir
postgres    GATEWAY_DATABASE_URL=postgresql://...: shared by replicas
migrations  the schema, as numbered steps applied on start
writer      the bounded buffer and the thread that flushes it in batches
recorder    the outermost call-chain layer: one record per proxied call
trail       which search a call followed
rows        a captured call as stored rows (status, code, summary, size)
cut         what is stored of large arguments and texts, cut to a byte budget, cheaply
redaction   secret keys and configured secrets out of what is stored
callers     session and client ids of a request
feedback    `submit_feedback` and `POST /feedback`
stats       `mcp-gateway stats` and the CSV export
service     `Records`: all of it wired together for a serving gateway
"""

from gateway.records.service import Records, open_store
from gateway.records.store import RecordsError, RecordStore, StoreUnavailable

__all__ = ["RecordStore", "Records", "RecordsError", "StoreUnavailable", "open_store"]
