"""The operator console: `/admin` (web pages) and `/admin/api/v1/` (JSON), served over HTTP only.

access    who may use it: admin principals, browser sessions, CSRF, the audit trail
views     plain data over a running gateway (servers, tools, approvals, calls, search, config)
          and the actions (restart, disable/enable, approve, tool disable/enable, reload)
switches  runtime tool disables
api       the JSON API, one route table
openapi   the OpenAPI 3.1 document made from that table
"""
