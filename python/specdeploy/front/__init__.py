"""The site's front door (issue 23): HAProxy in front of the engine hosts.

The engines publish on the hosts' internal addresses only; the front terminates TLS with the
site's certificate, lets through the engine's /v1 routes and health only (a path allow-list: the
engine's /metrics, /tokenize and /invocations answer without the API key), passes the client's
API key through unchanged, and spreads requests over the hosts. The same front serves one host
outside a migration; during one, it is driven through its runtime API: the new host in, the old
one drained (in-flight requests finish), the old one out.

`config` is the front's one model (the profile's `front:` section plus the backends, which come
from the inventory or the migration), `haproxy` renders and checks haproxy.cfg, `runtime` is a
client of HAProxy's runtime API (its admin unix socket), and `balancer` is the interface a
migration drives — HAProxy's runtime API, or a site's own balancer through a hook program
(docs/front.md).
"""
